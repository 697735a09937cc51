"""The elementwise kernels of plain PyTorch code run eagerly (``training.kernels = "pytorch"``
without ``training.compile``): what one operator at a time moves, per element of the tensor
it works on. The sources (torchtitan's Llama code) are in sim/model/layers.py's docstring;
sim/model/layers.py builds a layer's kernels from these."""

from .compute import Kernel

# Eager PyTorch (bytes per element of the tensor, forward; backward bytes; forward launches),
# each a sum over the operators of torchtitan's code (sim/model/layers.py's docstring):
# RMSNorm forward: x.float() 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2 = 36
#   in 6 kernels and the per-token rsqrt(+eps); backward, autograd's kernels of the same ops:
#   grad * weight 2+2, the weight's gradient (g * n, summed) 2+2+2+2, type_as 2+4, g * rsqrt 4+4,
#   the rsqrt's gradient (g * x, summed per token) 4+4+4+4, mean's expand / N 4, pow's 2 * x * g
#   4+4+4, the two gradients of x.float() added 4+4+4, .float()'s cast back 4+2 = 76.
EAGER_RMSNORM = (36, 76, 7)
# RoPE, per element of q and of k: .float() 2+4, the complex multiply by freqs_cis 4+4, type_as
#   4+2 = 20 in 3 kernels each (view_as_complex / view_as_real are views); backward the same
#   three in reverse (type_as, the conjugate multiply, the cast) = 20.
EAGER_ROPE = (20, 20, 3)
# SwiGLU, per element of the FFN width: F.silu 2+2, * w3(x) 2+2+2 = 10 in 2 kernels; backward:
#   the product's two gradients 2+2+2 each and silu's 2+2+2 = 18.
EAGER_SWIGLU = (10, 18, 2)
# Residual add (no dropout): 2+2+2 = 6; backward: the skip and branch gradients summed, 6.
EAGER_RESIDUAL = (6, 6, 1)


def eager(spec: tuple[int, int, int], elements: float) -> Kernel:
    """The memory-bound kernel ``spec`` (one of the EAGER_* tuples) stands for on ``elements``."""
    fwd, bwd, launches = spec
    return Kernel(bytes=fwd * elements, count=launches, bwd=bwd / fwd)
