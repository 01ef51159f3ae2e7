"""mooncake.tensor: how MooncakeDistributedStore's tensor calls (put_tensor,
get_tensor and their batch_, pub_ and _with_tp forms) lay out a PyTorch
tensor as an object, the same bytes as Mooncake's own binding
(mooncake-integration/integration_utils.h): a 40-byte TensorMetadata

    int32 dtype | int32 ndim | int64 shape[4] (unused dimensions -1)

in the machine's byte order, then the tensor's elements, contiguous, in
row-major order. A reader of the raw object (get, get_into) finds what
Mooncake's readers expect. The dtype numbers are Mooncake's TensorDtype;
a tensor of more than 4 dimensions or another dtype is refused, as there.

torch is imported when a tensor call is made, never by importing the
package: the store works without it. Tensors on a GPU are copied to host
memory first (the store's copies are made by the CPU).
"""

import ctypes
import struct

META = struct.Struct("=ii4q")  # TensorMetadata, 40 bytes
MAX_DIMS = 4

# Mooncake's TensorDtype numbers, by torch's name of the dtype.
DTYPES = {
    "float32": 0, "float64": 1, "int8": 2, "uint8": 3, "int16": 4, "uint16": 5,
    "int32": 6, "uint32": 7, "int64": 8, "uint64": 9, "bool": 10, "float16": 11,
    "bfloat16": 12, "float8_e4m3fn": 13, "float8_e5m2": 14,
}


def torch_module():
    """torch, or None when it cannot be imported."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _dtype_by_number(torch, number):
    for name, num in DTYPES.items():
        if num == number:
            return getattr(torch, name, None)
    return None


class Packed:
    """A tensor ready to be stored: its metadata and its elements in host
    memory (kept alive by this object until the put returns)."""

    def __init__(self, tensor, meta):
        self.tensor = tensor
        self.meta = ctypes.create_string_buffer(meta, len(meta))

    def parts(self):
        """(address, length) pieces of the object."""
        out = [(ctypes.addressof(self.meta), META.size)]
        nbytes = self.tensor.numel() * self.tensor.element_size()
        if nbytes:
            out.append((self.tensor.data_ptr(), nbytes))
        return out


def pack(tensor):
    """(Packed, None), or (None, why) for what cannot be stored."""
    torch = torch_module()
    if torch is None:
        return None, "torch cannot be imported"
    if not isinstance(tensor, torch.Tensor):
        return None, "not a PyTorch tensor (%s)" % type(tensor).__name__
    name = str(tensor.dtype).replace("torch.", "")
    if name not in DTYPES:
        return None, "unsupported dtype %s" % tensor.dtype
    if tensor.dim() > MAX_DIMS:
        return None, "a tensor of %d dimensions (at most %d)" % (tensor.dim(), MAX_DIMS)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    shape = list(t.shape) + [-1] * (MAX_DIMS - t.dim())
    return Packed(t, META.pack(DTYPES[name], t.dim(), *shape)), None


def _header(addr, length):
    """(dtype, shape, payload bytes) of an object at addr, or None."""
    if length < META.size:
        return None
    dtype, ndim, *shape = META.unpack(ctypes.string_at(addr, META.size))
    if ndim < 0 or ndim > MAX_DIMS or any(d < 0 for d in shape[:ndim]):
        return None
    return dtype, tuple(shape[:ndim]), length - META.size


def _checked(torch, head):
    """The torch dtype and shape of a header whose sizes agree, or None."""
    if head is None:
        return None
    number, shape, nbytes = head
    dtype = _dtype_by_number(torch, number)
    if dtype is None:
        return None
    count = 1
    for d in shape:
        count *= d
    if count * torch.empty((), dtype=dtype).element_size() != nbytes:
        return None
    return dtype, shape, nbytes


def copy_out(addr, length):
    """A new tensor from the object at [addr, addr + length), or None when
    it is not a stored tensor."""
    torch = torch_module()
    got = _checked(torch, _header(addr, length)) if torch else None
    if got is None:
        return None
    dtype, shape, nbytes = got
    t = torch.empty(shape, dtype=dtype)
    if nbytes:
        ctypes.memmove(t.data_ptr(), addr + META.size, nbytes)
    return t


def view_of(addr, length):
    """A tensor over the caller's memory [addr + 40, addr + length) (no
    copy: it lives as long as that memory), or None."""
    torch = torch_module()
    got = _checked(torch, _header(addr, length)) if torch else None
    if got is None:
        return None
    dtype, shape, nbytes = got
    if not nbytes:
        return torch.empty(shape, dtype=dtype)
    raw = (ctypes.c_ubyte * nbytes).from_address(addr + META.size)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def tp_key(key, rank):
    """The key of a tensor-parallel shard, as Mooncake names it."""
    return "%s_tp_%d" % (key, rank)


def chunks(tensor, tp_size, split_dim):
    """The tp_size shards of a tensor along split_dim (torch.chunk), or
    None when torch makes fewer."""
    parts = tensor.chunk(tp_size, split_dim)
    return [p.contiguous() for p in parts] if len(parts) == tp_size else None
