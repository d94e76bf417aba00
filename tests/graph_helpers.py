"""One op alone inside a graph-mode Cell, for the tests of the ops' Cells against numpy."""
import numpy as np
from mindspore import Tensor, nn


class Apply(nn.Cell):
    """op(*args) as a graph-mode Cell's construct."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, *args):
        return self.op(*args)


def run(cell, *arrays):
    """cell on numpy arrays -> its output as a numpy array."""
    return cell(*(Tensor(a) for a in arrays)).asnumpy()


def close(out, ref, tol):
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=tol, atol=tol)
