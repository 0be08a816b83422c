"""A GPU's placement rules without a GPU: runs whose tensors live on the meta device (shapes, dtypes and devices,
no data), checked op by op.

`VirtualDevice` is a dispatch mode that sees every aten op of a run and refuses what a CUDA device would refuse:
tensors of two devices in one op (a 0-dim CPU tensor is a scalar, as CUDA allows; index tensors may stay on the CPU,
as CUDA moves them) and matmuls of two dtypes. The meta device's own kernels let both through for matmuls, which is
why the check is ours. It also counts the bytes of the tensors the run allocates on the device and keeps their peak,
like `torch.cuda.max_memory_allocated` without the allocator's rounding (weights made before the mode are not
counted).
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default,
             aten._scaled_dot_product_fused_attention_overrideable.default}
COPIES = {aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default}
TO_HOST = {aten._to_copy.default, aten.to.dtype_layout, aten.to.device}  # (under inference mode .cpu() is aten.to)
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class DeviceMix(AssertionError):
    pass


class VirtualDevice(TorchDispatchMode):
    def __init__(self, device: str = "meta", readable: bool = False):
        """`readable`: copies from the device to the CPU give zeros (a whole run can then hand its outputs to the
        host), instead of the meta device's error."""
        super().__init__()
        self.device, self.readable = torch.device(device), readable
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, tensors holding it]
        self.allocated = self.peak = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        if self.readable and func in TO_HOST and args[0].device == self.device and \
                kwargs.get("device", args[1] if len(args) > 1 else None) == torch.device("cpu"):
            return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if self.readable and func is aten.copy_.default and args[0].device.type == "cpu" and \
                args[1].device == self.device:  # into a host tensor (a run's output, filled as it comes)
            return args[0].zero_()
        if func not in COPIES:
            checked = [args[0], *args[2:3]] if func in INDEXING else (args, kwargs)  # not the index tensors
            tensors = [t for t in tree_leaves(checked) if isinstance(t, torch.Tensor)]
            devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                raise DeviceMix(f"{func} mixes devices {sorted(map(str, devices))}: shapes "
                                f"{[(tuple(t.shape), str(t.device)) for t in tensors]}")
            if func in MATMULS or func in ATTENTION:
                dtypes = {t.dtype for t in tensors if t.dim() > 0}
                if len(dtypes) > 1:
                    raise DeviceMix(f"{func} mixes dtypes {sorted(map(str, dtypes))}")
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device == self.device:
                self._hold(t, inputs)
        return out

    def _hold(self, t: torch.Tensor, inputs: set[int]) -> None:
        """Count a new storage, or one more tensor on a counted one (a view); an alias of storage made before the
        mode (a weight, `.to()` returning itself) is not an allocation."""
        key = t.untyped_storage()._cdata
        entry = self.live.get(key)
        if entry is None and key in inputs:
            return
        if entry is None:
            entry = self.live[key] = [t.untyped_storage().nbytes(), 0]
            self.allocated += entry[0]
            self.peak = max(self.peak, self.allocated)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.allocated -= entry[0]
            del self.live[key]


def place_like_a_host(model: torch.nn.Module, device: str = "meta", streamed=(torch.nn.Linear,)) -> None:
    """Put `model` where a host's low-VRAM loading leaves it: the layers it can stream (`streamed`, ComfyUI's
    cast layers) on the compute `device`, every other module's parameters in CPU memory."""
    for module in model.modules():
        home = device if isinstance(module, streamed) else "cpu"
        for name, p in module.named_parameters(recurse=False):
            setattr(module, name, torch.nn.Parameter(p.data.to(home), requires_grad=False))
