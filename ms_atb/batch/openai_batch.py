"""The OpenAI batch format of ms-atb-generate: one request a line in, one result a line out.

Input line:  {"custom_id": str, "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
              "body": {"model": ..., "messages" | "prompt": ..., "max_tokens": ..., sampling fields...}}
Output line: {"id", "custom_id", "response": {"status_code": 200, "request_id", "body": a chat.completion or
              text_completion object}, "error": null}; a request that cannot run gets
             {"id", "custom_id", "response": null, "error": {"code", "message", "line"}}.

Rules:
  1. parse_line turns a line into the BatchItem ms-atb-generate runs (its id is the custom_id; prompt or
     messages, SamplingParams fields, and the endpoint in `openai`) or into one with `error` set. It never
     raises: in this format every invalid line becomes an error line and the rest of the file runs.
  2. Body fields map onto SamplingParams (SAMPLING_FIELDS and the per-endpoint ones; response_format as
     ms_atb/batch/response_format.py says); "model" is accepted whatever it says and echoed; a field in NO_OP is accepted at the values listed there, which change
     nothing; any other field is an error naming it. A null field is unset: the job's defaults apply.
  3. A line whose custom_id cannot be read has the id ("line", N) and "custom_id": null in its error line;
     result_key reads that back from "error.line", so --resume never writes a line twice.
  4. usage counts tokens: prompt_tokens those of the prompt the engine ran (after the chat template and any
     truncation), completion_tokens those of every choice (the token that ended it included).
"""
from __future__ import annotations

import json
import time
import uuid

from ms_atb.batch import json_line, response_format
from ms_atb.batch.item import BatchItem, OpenAIEndpoint
from ms_atb.sampling_params import MAX_LOGPROBS, OPENAI, is_int, sampling_fields

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)
# Body fields that are SamplingParams fields of the same name, on both endpoints: OpenAI's, and the extensions
# vLLM's server accepts in the body (SamplingParams declares which).
SAMPLING_FIELDS = tuple(f.name for f in sampling_fields(OPENAI))
ENDPOINT_FIELDS = {CHAT_URL: ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format"),
                   COMPLETIONS_URL: ("prompt", "logprobs", "response_format")}
# Fields accepted only at values that change nothing (a streamed or echoed answer has no place in a batch file).
NO_OP = {"stream": (False,), "echo": (False,), "suffix": ("",), "best_of": (1,), "stream_options": ()}
LOGPROB_FLOOR = -9999.0     # stands for -inf, which JSON cannot hold (as vLLM writes it)


def is_batch_line(obj) -> bool:
    """A parsed JSON line of this format (what --format auto looks for in the first JSON object)."""
    return isinstance(obj, dict) and "custom_id" in obj


def error_item(lineno: int, message: str, code: str, custom_id: str | None = None) -> BatchItem:
    """The item of a line that cannot run (rule 3 for its id)."""
    return BatchItem(("line", lineno) if custom_id is None else custom_id, lineno, error=message, error_code=code)


def parse_line(text: str, lineno: int, path: str) -> BatchItem:
    """One non-blank input line -> a request item or an error item (rule 1)."""
    try:
        line = json_line.loads(text)
    except json.JSONDecodeError as e:
        return error_item(lineno, f"{path}:{lineno}: not valid JSON ({e.msg})", "invalid_json_line")
    except ValueError as e:
        return error_item(lineno, f"{path}:{lineno}: not valid here: {e}", "invalid_json_line")
    custom_id = line.get("custom_id") if isinstance(line, dict) else None
    if not isinstance(custom_id, str):
        got = json.dumps(custom_id) if isinstance(line, dict) else f"a JSON {type(line).__name__}"
        return error_item(lineno, f"{path}:{lineno}: each line is an object with a string 'custom_id', got {got}",
                          "invalid_custom_id")
    where = f"{path}:{lineno} (custom_id {custom_id!r})"
    if line.get("method", "POST") != "POST":
        return error_item(lineno, f"{where}: method must be 'POST', got {line['method']!r}", "invalid_method",
                          custom_id)
    url = line.get("url")
    if url not in URLS:
        return error_item(lineno, f"{where}: url {url!r} is not supported; allowed: {list(URLS)}", "invalid_url",
                          custom_id)
    try:
        prompt, messages, sampling, endpoint = _parse_body(line.get("body"), url)
    except ValueError as e:
        code = getattr(e, "code", "invalid_request")
        return error_item(lineno, f"{where}: {e}", code, custom_id)
    extra = sorted(set(line) - {"custom_id", "method", "url", "body"})
    if extra:
        return error_item(lineno, f"{where}: unknown field(s) {extra} beside the body; a line holds custom_id, "
                                  f"method, url and body", "invalid_request", custom_id)
    return BatchItem(custom_id, lineno, prompt, messages, sampling, endpoint)


def _parse_body(body, url: str) -> tuple:
    """A request body -> (prompt, messages, SamplingParams fields, endpoint); ValueError saying what is wrong."""
    if not isinstance(body, dict):
        raise ValueError(f"body must be an object, got {json.dumps(body)}")
    body = {k: v for k, v in body.items() if v is not None}              # rule 2: null is unset
    _check_fields(body, url)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"model must be a string, got {json.dumps(model)}")
    sampling = {k: body[k] for k in (*SAMPLING_FIELDS, response_format.FIELD) if k in body}
    if response_format.FIELD in sampling:
        response_format.structured_fields(sampling[response_format.FIELD])      # its shape; the job applies it
    if url == CHAT_URL:
        messages = _messages(body.get("messages"))
        return None, messages, sampling, OpenAIEndpoint(url, model, _chat_fields(body, sampling))
    if "logprobs" in body:
        sampling["logprobs"] = body["logprobs"]               # SamplingParams checks the count
    return _prompt(body.get("prompt")), None, sampling, OpenAIEndpoint(url, model)


def _check_fields(body: dict, url: str) -> None:
    """ValueError (code unsupported_parameter) naming the body fields this endpoint does not take (rule 2)."""
    own = ENDPOINT_FIELDS[url]
    unsupported = sorted(k for k in body if k not in SAMPLING_FIELDS and k not in own and k not in ("model", "user")
                         and not _no_op(k, body[k]))
    if unsupported:
        named = [f"{k}: {json.dumps(body[k])}" if k in NO_OP else k for k in unsupported]
        defaults = ", ".join(f"{k}: {json.dumps(v[0]) if v else 'null'}" for k, v in NO_OP.items())
        error = ValueError(f"unsupported body field(s) {named}; {url} takes {['model', *own, *SAMPLING_FIELDS]}, "
                           f"and these only at their defaults: {defaults}")
        error.code = "unsupported_parameter"
        raise error


def _chat_fields(body: dict, sampling: dict) -> int | None:
    """The chat endpoint's max_completion_tokens and logprobs / top_logprobs, into sampling; returns
    top_logprobs."""
    if "max_completion_tokens" in body:
        if "max_tokens" in body and body["max_tokens"] != body["max_completion_tokens"]:
            raise ValueError(f"max_tokens ({body['max_tokens']!r}) and max_completion_tokens "
                             f"({body['max_completion_tokens']!r}) differ; give one")
        sampling["max_tokens"] = body["max_completion_tokens"]
    if not isinstance(body.get("logprobs", False), bool):
        raise ValueError(f"logprobs must be a bool on {CHAT_URL}, got {json.dumps(body['logprobs'])}")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and (not is_int(top_logprobs) or not 0 <= top_logprobs <= MAX_LOGPROBS):
        raise ValueError(f"top_logprobs must be an int in [0, {MAX_LOGPROBS}], got {json.dumps(top_logprobs)}")
    if top_logprobs is not None and not body.get("logprobs"):
        raise ValueError("top_logprobs needs logprobs: true")
    if body.get("logprobs"):
        sampling["logprobs"] = top_logprobs or 0
    return top_logprobs


def _no_op(key: str, value) -> bool:
    """value is one NO_OP lists for key (of the same JSON type: true is not 1)."""
    return any(type(value) is type(v) and value == v for v in NO_OP.get(key, ()))


def _messages(messages) -> list[dict]:
    """A chat; each content a string or a list of text parts (joined)."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{CHAT_URL} needs 'messages': a non-empty list of {{'role', 'content'}} objects")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ValueError(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': str}}) "
                                 f"are supported")
            m = {**m, "content": "".join(p["text"] for p in content)}
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] needs a string 'role' and a string (or text parts) 'content'")
        out.append(m)
    return out


def _prompt(prompt):
    """A text or a list of token ids (checked against the vocabulary later); one prompt a line."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                  # a batch of one
    if isinstance(prompt, str) or isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        return prompt
    raise ValueError(f"{COMPLETIONS_URL} needs 'prompt': a string or a non-empty list of token ids (one prompt "
                     f"a line), got {json.dumps(prompt)[:80]}")


def error_line(item: BatchItem, message: str) -> dict:
    """The output line of a request that cannot run."""
    custom_id = item.id if isinstance(item.id, str) else None
    return {"id": _new_id("batch_req"), "custom_id": custom_id, "response": None,
            "error": {"code": item.error_code, "message": message, "line": item.line}}


def result_line(item: BatchItem, output, tokenizer, default_model: str) -> dict:
    """The output line of a finished request: item from parse_line, output its RequestOutput."""
    meta = item.openai
    chat = meta.url == CHAT_URL
    choices = []
    for c in output.outputs:
        choice = {"index": c.index}
        if chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choice["logprobs"] = None
        if c.logprobs is not None:
            choice["logprobs"] = (_chat_logprobs(c, tokenizer, meta.top_logprobs or 0) if chat
                                  else _text_logprobs(c, tokenizer))
        choice["finish_reason"] = c.finish_reason
        choices.append(choice)
    num_prompt = len(output.prompt_token_ids)
    num_completion = sum(len(c.token_ids) for c in output.outputs)
    body = {"id": _new_id("chatcmpl" if chat else "cmpl"), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": meta.model or default_model, "choices": choices,
            "usage": {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
                      "total_tokens": num_prompt + num_completion}}
    return {"id": _new_id("batch_req"), "custom_id": item.id,
            "response": {"status_code": 200, "request_id": _new_id("req"), "body": body}, "error": None}


def result_key(record):
    """What --resume counts as done for an output line of this format (rule 3), or None if it is not one."""
    if not isinstance(record, dict) or not {"custom_id", "response", "error"} <= set(record):
        return None
    if isinstance(record["custom_id"], str):
        return record["custom_id"]
    line = record["error"].get("line") if isinstance(record["error"], dict) else None
    return ("line", line) if is_int(line) else None


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}" if prefix == "batch_req" else f"{prefix}-{uuid.uuid4().hex}"


def _token(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and UTF-8 bytes; without a tokenizer "token_id:<id>" (as vLLM names them)."""
    if tokenizer is None:
        text = f"token_id:{token_id}"
        return text, list(text.encode())
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", "replace"), list(raw)


def _logprob(value: float) -> float:
    return max(float(value), LOGPROB_FLOOR)


def _chat_logprobs(c, tokenizer, top: int) -> dict:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": the `top` most likely}]}, one per token."""
    def entry(token_id: int, logprob: float) -> dict:
        text, raw = _token(tokenizer, token_id)
        return {"token": text, "logprob": _logprob(logprob), "bytes": raw}

    content = []
    for token_id, alternatives in zip(c.token_ids, c.logprobs):
        best = sorted(alternatives.items(), key=lambda kv: -kv[1])[:top]
        content.append({**entry(token_id, alternatives[token_id]), "top_logprobs": [entry(*kv) for kv in best]})
    return {"content": content}


def _text_logprobs(c, tokenizer) -> dict:
    """The completions form: tokens, token_logprobs, top_logprobs (the chosen token and the most likely ones,
    by text) and each token's character offset in the text."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = 0
    for token_id, alternatives in zip(c.token_ids, c.logprobs):
        text = _token(tokenizer, token_id)[0]
        tokens.append(text)
        token_logprobs.append(_logprob(alternatives[token_id]))
        top_logprobs.append({_token(tokenizer, t)[0]: _logprob(lp) for t, lp in alternatives.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}
