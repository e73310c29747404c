"""Descriptions (:class:`mscclpp.BufferRef`) of the buffers that the native module cannot read
through the buffer protocol: torch tensors and objects with ``__cuda_array_interface__``
(CuPy arrays, Numba device arrays).

The native module calls :func:`describe` for such objects; NumPy arrays, ``bytearray``,
:class:`mscclpp.RawGpuBuffer` and :class:`mscclpp.BufferRef` need no description.
"""

from __future__ import annotations

from typing import Any

from ._mscclpp import BufferRef, MscclppError

#: ``BufferRef.device`` of GPU memory whose ordinal the object does not tell: taken to be the
#: communicator's GPU.
ANY_GPU = -2

_TORCH_DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
}

_TYPESTR_DTYPES = {
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
    "i1": "int8",
    "u1": "uint8",
    "i4": "int32",
    "u4": "uint32",
    "i8": "int64",
    "u8": "uint64",
}


def _describe_torch(t: Any) -> BufferRef:
    import torch  # the object is a tensor: torch is loaded

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{type(t).__name__}: expected a torch.Tensor")
    name = str(t.dtype).removeprefix("torch.")
    kind = f"torch.Tensor of torch.{name} on {t.device}"
    if t.device.type == "cuda":
        device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(t.device).cuda_stream
    elif t.device.type == "cpu":
        device, stream = -1, None
    else:
        raise MscclppError(f"{kind}: expected a CUDA or CPU tensor")
    return BufferRef(
        t.data_ptr(),
        t.numel() * t.element_size(),
        _TORCH_DTYPES.get(name),
        device,
        readonly=False,
        contiguous=t.is_contiguous(),
        stream=stream,
        owner=t,
        kind=kind,
    )


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _describe_cai(obj: Any, cai: dict[str, Any]) -> BufferRef:
    typestr = str(cai.get("typestr", ""))
    shape = tuple(int(n) for n in cai.get("shape", ()))
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    count = 1
    for n in shape:
        count *= n
    ptr, readonly = cai.get("data", (0, False))
    mod = type(obj).__module__
    kind = f"{mod}.{type(obj).__name__} of {typestr}"
    dev = getattr(obj, "device", None)
    device = getattr(dev, "id", None)
    if device is None:
        device = getattr(dev, "index", None)
    stream = None
    if mod.startswith("cupy"):
        import cupy  # the object is CuPy's: cupy is loaded

        stream = cupy.cuda.get_current_stream().ptr
    if typestr.startswith(">"):
        raise MscclppError(f"{kind}: big-endian data: expected native byte order")
    return BufferRef(
        int(ptr or 0),
        count * itemsize,
        _TYPESTR_DTYPES.get(typestr[1:]),
        ANY_GPU if device is None else int(device),
        readonly=bool(readonly),
        contiguous=_c_contiguous(shape, cai.get("strides"), itemsize),
        stream=stream,
        owner=obj,
        kind=kind,
    )


def describe(obj: Any) -> BufferRef:
    """A :class:`BufferRef` of a torch tensor or an object with ``__cuda_array_interface__``.

    Its ``stream`` is the object's current stream (torch's ``current_stream``, CuPy's
    ``get_current_stream``), which the collectives use when a call names none.
    """
    if isinstance(obj, BufferRef):
        return obj
    mod = type(obj).__module__
    if mod == "torch" or mod.startswith("torch."):
        return _describe_torch(obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _describe_cai(obj, cai)
    raise TypeError(
        f"{type(obj).__name__}: expected a torch tensor or an object with __cuda_array_interface__"
    )
