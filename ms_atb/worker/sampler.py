"""Sampler: logits -> one token id per request (penalties, logit bias and token masks, then greedy or
temperature, min-p, top-k, top-p), seeded per request.

Each sampled request takes exactly ONE uniform draw from its own generator, so its tokens depend
only on its seed and its own logits, never on what else is in the batch. Ties are broken towards
the lowest token id everywhere (greedy argmax, top-k boundary, nucleus order).
"""
from __future__ import annotations

import numpy as np

from ms_atb.sampling_params import SamplingParams

# Candidates tried before sorting the whole row when only top-p filters (the nucleus is usually small).
_TOP_P_PROBE = 256
# Block width of the two-level inverse-CDF search over a whole row.
_BLOCK = 256


def _top_candidates(logits: np.ndarray, m: int) -> np.ndarray:
    """Ids of the m largest logits [V], ordered by (value desc, id asc); exact under ties."""
    v = logits.shape[0]
    if m >= v:
        return np.argsort(-logits, kind="stable")
    part = np.argpartition(-logits, m - 1)[:m]
    boundary = logits[part].min()
    if np.count_nonzero(logits >= boundary) > m:
        cand = np.flatnonzero(logits >= boundary)    # every tie at the boundary, ids ascending
    else:
        cand = np.sort(part)
    return cand[np.argsort(-logits[cand], kind="stable")][:m]


def _nucleus_size(probs_sorted: np.ndarray, top_p: float) -> int:
    """How many of the sorted probabilities the nucleus keeps: those whose preceding mass < top_p."""
    probs_sorted = probs_sorted.astype(np.float64)
    exclusive = np.cumsum(probs_sorted) - probs_sorted
    return max(1, int(np.count_nonzero(exclusive < top_p)))


def _draw(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF draw of an index from unnormalised non-negative weights with uniform u in [0, 1)."""
    cdf = np.cumsum(weights, dtype=np.float64)
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return min(idx, weights.shape[0] - 1)


def _draw_rows(e: np.ndarray, u: np.ndarray) -> np.ndarray:
    """_draw for every row of e [P, V] at once: block sums, then one block's cumsum per row."""
    p, v = e.shape
    nb = -(-v // _BLOCK)
    if nb * _BLOCK != v:
        e = np.pad(e, ((0, 0), (0, nb * _BLOCK - v)))
    blocks = e.reshape(p, nb, _BLOCK)                                      # [P, NB, BLOCK]
    cum = np.cumsum(blocks.sum(axis=2, dtype=np.float64), axis=1)          # [P, NB]
    target = u * cum[:, -1]                                                # [P]
    blk = np.minimum(np.count_nonzero(cum <= target[:, None], axis=1), nb - 1)
    out = np.empty(p, dtype=np.int64)
    for r in range(p):
        b = blk[r]
        w = blocks[r, b]
        rest = target[r] - (cum[r, b - 1] if b > 0 else 0.0)
        i = int(np.searchsorted(np.cumsum(w, dtype=np.float64), rest, side="right"))
        if i >= _BLOCK:                              # rounding at the very end of the block
            i = int(np.flatnonzero(w)[-1])
        out[r] = b * _BLOCK + i
    return np.minimum(out, v - 1)


def _sample_filtered(logits: np.ndarray, e: np.ndarray, top_k: int, top_p: float, u: float) -> int:
    """logits [V] orders the tokens; e [V] = exp((logits - max) / temperature); top-k then top-p."""
    v = logits.shape[0]
    if top_k != -1:
        ids = _top_candidates(logits, min(top_k, v))
        probs = e[ids].astype(np.float64)
        probs /= probs.sum()
        if top_p < 1.0:
            probs = probs[:_nucleus_size(probs, top_p)]
        return int(ids[_draw(probs, u)])
    total = e.sum(dtype=np.float64)
    ids = _top_candidates(logits, min(_TOP_P_PROBE, v))
    c = _nucleus_size(e[ids] / total, top_p)
    if c == len(ids) and c < v:                      # the nucleus may reach past the probe
        c = _nucleus_size(np.sort(e)[::-1] / total, top_p)
        ids = _top_candidates(logits, c)
    return int(ids[_draw(e[ids[:c]], u)])


def apply_penalties(logits: np.ndarray, params: list[SamplingParams], histories) -> np.ndarray:
    """logits [B, V] with each request's repetition, presence and frequency penalties applied (a copy
    when any applies). histories[b] = (token_ids, num_prompt_tokens): the request's tokens so far.
    Repetition: a positive logit of a token in the prompt or output is divided by the penalty, a negative
    one multiplied. Presence and frequency: the logit of a generated token drops by presence + frequency
    x its count in the output."""
    rows = [b for b, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    if histories is None:
        raise ValueError("repetition, presence and frequency penalties need each request's tokens so far")
    out = np.array(logits, dtype=np.float32)
    v = out.shape[1]
    for b in rows:
        p, (tokens, num_prompt) = params[b], histories[b]
        ids = np.asarray(tokens, dtype=np.int64)                    # [N]
        row = out[b]                                                # [V], a view
        if p.repetition_penalty != 1.0:
            seen = np.unique(ids)
            x = row[seen]
            with np.errstate(over="ignore"):          # past float32: +inf, which sample() handles
                row[seen] = np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            counts = np.bincount(ids[num_prompt:], minlength=v)    # [V]
            generated = np.flatnonzero(counts)
            row[generated] -= p.presence_penalty + p.frequency_penalty * counts[generated]
    return out


def apply_bias_and_masks(logits: np.ndarray, params: list[SamplingParams], banned=None,
                         owned: bool = False, allowed=None) -> np.ndarray:
    """logits [B, V] with each request's logit_bias added, tokens outside its allowed_token_ids or
    outside allowed[b] (token ids, or this step's grammar mask: float32 [V], 0 where allowed and -inf elsewhere,
    added) and its banned ones (banned[b]: stop tokens before min_tokens, bad words' last tokens) at -inf. A ban
    that would leave no token at all is skipped. Writes into logits only when owned (else into a copy)."""
    rows = [b for b, p in enumerate(params)
            if p.logit_bias or p.allowed_token_ids is not None or (banned is not None and banned[b])
            or (allowed is not None and allowed[b] is not None)]
    if not rows:
        return logits
    out = logits if owned else np.array(logits, dtype=np.float32)
    for b in rows:
        p, row = params[b], out[b]                                  # row [V], a view
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias, dtype=np.int64, count=len(p.logit_bias))
            row[ids] += np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(ids))
        for ids in (p.allowed_token_ids, None if allowed is None else allowed[b]):
            if ids is None:
                continue
            if isinstance(ids, np.ndarray) and ids.dtype == np.float32:        # [V]: 0 allowed, -inf not
                if p.has_penalties:              # a penalty may have made a logit +inf: +inf - inf would be NaN
                    np.minimum(row, np.finfo(np.float32).max, out=row)
                np.add(row, ids, out=row)
            else:
                kept = row[ids]
                row[:] = -np.inf
                row[ids] = kept
        if banned is not None and banned[b]:
            ids = list(banned[b])
            saved = row[ids]
            row[ids] = -np.inf
            if not np.isfinite(row).any():                          # nothing left: no ban this step
                row[ids] = saved
    return out


def token_logprobs(logits: np.ndarray, token: int, top: int) -> dict[int, float]:
    """{token id: log-probability} under the model's distribution (logits [V] before penalties and
    temperature): the chosen token and the `top` most likely ones (ties: lowest ids)."""
    return rows_logprobs(logits[None], [token], top)[0]


def rows_logprobs(logits: np.ndarray, tokens, top: int) -> list[dict[int, float]]:
    """token_logprobs for each row of logits [R, V] and its token (tokens [R]), normalisers in one pass.
    exp in float32 (SIMD; float64's is ~16x slower here), sums in float64: log Z within ~1e-7."""
    m = logits.max(axis=1, keepdims=True)                                             # [R, 1]
    log_z = m[:, 0].astype(np.float64) + np.log(np.exp(logits - m).sum(axis=1, dtype=np.float64))  # [R]
    out = []
    for r, token in enumerate(tokens):
        ids = [int(token), *(_top_candidates(logits[r], top).tolist() if top else [])]
        out.append({i: float(logits[r, i]) - float(log_z[r]) for i in ids})
    return out


def _nan_error(row: int) -> RuntimeError:
    return RuntimeError(f"the logits of batch row {row} hold NaN: the model's numerics broke (weights, or an "
                        f"overflow in its dtype); no token can be chosen")


def _keep_only_infinite(rows: np.ndarray, top: np.ndarray, sampled: list[int]) -> None:
    """Rows [S, V] whose max top [S, 1] is not finite, in place: NaN is an error; where some logits are
    +inf (a repetition penalty can divide one past float32), those tokens are the only candidates, equally
    likely (exp(inf - inf) would be NaN)."""
    nan = np.flatnonzero(np.isnan(top[:, 0]))
    if nan.size:
        raise _nan_error(sampled[nan[0]])
    inf = np.isposinf(top[:, 0])
    rows[inf] = np.where(rows[inf] == np.inf, 0.0, -np.inf)
    top[inf] = 0.0


class Sampler:
    def __init__(self):
        self._default_rng = np.random.default_rng()

    def sample(self, logits: np.ndarray, params: list[SamplingParams],
               generators: list[np.random.Generator | None], histories=None, banned=None,
               allowed=None) -> list[int]:
        # logits: [B, V] float32; histories: see apply_penalties (needed only when a request has penalties);
        # banned: None, or per row None or the token ids it may not take now (stop tokens before min_tokens,
        # bad words); allowed: None, or per row None or what it may take now (a structured output's grammar mask,
        # float32 [V]: 0 allowed, -inf not)
        assert logits.ndim == 2 and logits.shape[0] == len(params) == len(generators), \
            (logits.shape, len(params), len(generators))
        given, logits = logits, apply_penalties(logits, params, histories)
        logits = apply_bias_and_masks(logits, params, banned, owned=logits is not given, allowed=allowed)
        b = logits.shape[0]
        out = [0] * b
        greedy = [i for i in range(b) if params[i].greedy]
        if greedy:
            picked = logits if len(greedy) == b else logits[greedy]       # all greedy: no copy
            for i, t in zip(greedy, np.argmax(picked, axis=1)):           # argmax: first (lowest id) max
                if np.isnan(logits[i, t]):                                  # argmax stops at the first NaN
                    raise _nan_error(i)
                out[i] = int(t)
        sampled = [i for i in range(b) if not params[i].greedy]
        if not sampled:
            return out
        u = np.array([(generators[i] or self._default_rng).random() for i in sampled])   # [S]
        rows = logits[sampled].astype(np.float32)                                        # [S, V]
        # [S]; past 1e30 every finite logit gap divides to ~0 anyway, and a float32 inf would turn the -inf
        # of a masked token into NaN
        temps = np.array([min(params[i].temperature, 1e30) for i in sampled], dtype=np.float32)
        top = rows.max(axis=1, keepdims=True)                                            # [S, 1]
        if not np.isfinite(top).all():
            _keep_only_infinite(rows, top, sampled)
        e = np.exp((rows - top) / temps[:, None])                                        # [S, V]
        for j, i in enumerate(sampled):                     # e is p / p_max: min-p keeps e >= min_p
            if params[i].min_p > 0.0:
                e[j][e[j] < params[i].min_p] = 0.0
        plain = [j for j, i in enumerate(sampled) if params[i].top_k == -1 and params[i].top_p >= 1.0]
        if plain:
            for j, t in zip(plain, _draw_rows(e[plain], u[plain])):
                out[sampled[j]] = int(t)
        for j, i in enumerate(sampled):
            p = params[i]
            if p.top_k != -1 or p.top_p < 1.0:
                out[i] = _sample_filtered(rows[j], e[j], p.top_k, p.top_p, float(u[j]))
        return out
