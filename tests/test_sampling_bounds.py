"""SamplingParams' documented upper bounds: n (samples per request) and logprobs."""
import pytest

from ms_atb.sampling_params import MAX_LOGPROBS, MAX_N, SamplingParams


def test_n_is_bounded_by_max_n():
    assert SamplingParams(n=MAX_N).n == MAX_N
    for bad in (MAX_N + 1, 100000):
        with pytest.raises(ValueError, match=rf"n must be an int >= 1 and <= MAX_N = {MAX_N} .*got {bad}"):
            SamplingParams(n=bad)
    params = SamplingParams(n=2)
    params.n = 100000                       # a field changed after construction is checked again
    with pytest.raises(ValueError, match=f"{MAX_N}"):
        params.validate()


def test_bounds_are_documented():
    doc = SamplingParams.__doc__
    assert f"n <= MAX_N = {MAX_N}" in doc and f"MAX_LOGPROBS = {MAX_LOGPROBS}" in doc
