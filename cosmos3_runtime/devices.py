"""What the runtime asks of a device, answered once per device; and the optional torch APIs, looked up once.

Code that torch.compile traces (the media block, the Reasoner's decode step, the core MODEL's forward under
ComfyUI's TorchCompileModel) must not call `torch.backends.*` wrappers or `torch.cuda.*` queries: Dynamo cannot
trace them (a graph break at every call, or an error under fullgraph). It reads `facts(device)` instead: a frozen
record made the first time a device is asked about. The record is made from queries Dynamo can trace
(`torch.cuda.get_device_properties`, `torch._C._get_flash_sdp_enabled`), so even a first question inside a compiled
region traces; the probes that run a kernel (fp8 matmuls, SDPA's kernel choice) run only outside compiled code, and
inside it the documented rule stands in until an eager call has made the record.

Tests put a device's record in place (`remember`) to run one device's branches on another (a CPU made to answer
like an H100, an RTX 5090 or a T4).
"""

import importlib.util
from contextlib import contextmanager
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP4 = getattr(torch, "float4_e2m1fn_x2", None)  # two E2M1 values a byte: torch 2.8 and newer
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class DeviceFacts:
    type: str  # the torch device type: "cpu", "cuda", "mps", ...
    capability: tuple[int, int] | None = None  # CUDA compute capability (None elsewhere)
    rocm: bool = False  # a HIP build of torch (its "cuda" devices are AMD GPUs)
    flash_sdp: bool = True  # SDPA's flash kernel is enabled in this process
    grouped_sdp: bool = False  # the CPU's fused SDPA kernel takes grouped K/V (torch 2.9 and newer)
    grouped_sdp_masked: bool = False  # ... also with a mask
    fp8_tensorwise: bool = False  # torch._scaled_mm with tensorwise scales runs here (an fp8 GEMM)
    fp8_rowwise: bool = False  # torch._scaled_mm with row-wise scales runs here (refused on compute capability 12.x;
    # on the CPU from torch 2.8 on, slowly: for checking the arithmetic)
    triton: bool = False  # torch.compile can make this device's kernels (Triton installed, often not on Windows; on
    # CUDA a card of compute capability 7.0 or newer, as torch's own has_triton asks)
    fp4: bool = False  # torch._scaled_mm with NVFP4 operands (E2M1 values, e4m3 scales per 16) runs here (compute
    # capability 10.x and 12.x with a torch that has float4_e2m1fn_x2)

    @property
    def cuda(self) -> bool:
        return self.type == "cuda" and not self.rocm

    def grouped_kv(self, dtype: torch.dtype, head_dim: int, masked: bool = False) -> bool:
        """Whether SDPA runs grouped-query inputs (fewer K/V heads than query heads) in a kernel that never holds the
        [heads, Nq, Nk] scores. The CPU's flash kernel takes them from torch 2.9 on (2.7 and 2.8 fall back to the
        math kernel: 9 GB for a 16k-token prompt). On a CUDA GPU only the flash kernel does, and it needs fp16/bf16,
        compute capability 8.0 or newer, a head dim of at most 256 (a multiple of 8) and no mask; with fp32 weights
        or on an older card SDPA would fall back to its math kernel, whose fp32 scores for Edge at 832x480x81 take
        4.3 GB per head (69 GB for its 16). Elsewhere (ROCm, other devices) K/V are expanded to the query heads so a
        memory-efficient kernel runs."""
        if self.type == "cpu":
            return self.grouped_sdp_masked if masked else self.grouped_sdp
        if not self.cuda or self.capability is None:
            return False
        return (self.flash_sdp and not masked and self.capability >= (8, 0) and dtype in HALF and head_dim % 8 == 0
                and head_dim <= 256)

    def attention_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype SDPA runs in for activations of `dtype`: below compute capability 8.0 (T4, V100, RTX 20xx) the
        memory-efficient kernel takes fp16 and fp32 only, so bf16 attention would fall to the math kernel (4.6 GB of
        scores per call for Edge at 480p); it runs in fp16 there (queries and keys are RMS-normed, softmax is fp32
        inside the kernel)."""
        if dtype == torch.bfloat16 and self.cuda and self.capability is not None and self.capability < (8, 0):
            return torch.float16
        return dtype


_FACTS: dict[tuple[str, int | None], DeviceFacts] = {}


def facts(device: torch.device) -> DeviceFacts:
    """The record of `device`, made on the first question (a plain dictionary lookup after that)."""
    key = _key(device)
    found = _FACTS.get(key)
    if found is None:
        found = _probe(device)
        if not torch.compiler.is_compiling():  # a record made while tracing lacks the kernel probes: not kept
            _FACTS[key] = found
    return found


def remember(device: torch.device, record: DeviceFacts | None) -> None:
    """Put `record` in place for `device` (None: forget it, so the next question probes again)."""
    if record is None:
        _FACTS.pop(_key(device), None)
    else:
        _FACTS[_key(device)] = record


@contextmanager
def answering_as(device: torch.device, record: DeviceFacts):
    """`record` in place for `device` inside the block (a count on the meta device taking a GPU's branches), the
    earlier record, or none, after it."""
    before = _FACTS.get(_key(device))
    remember(device, record)
    try:
        yield
    finally:
        remember(device, before)


def _key(device: torch.device) -> tuple[str, int | None]:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return "cuda", torch.cuda.current_device()
    return device.type, device.index


def _probe(device: torch.device) -> DeviceFacts:
    device = torch.device(device)
    triton = importlib.util.find_spec("triton") is not None
    if device.type == "cpu":  # (W8A8 runs its exact float32 emulation here: fp8_tensorwise stays off)
        if torch.compiler.is_compiling():
            return DeviceFacts("cpu", triton=triton)
        return DeviceFacts("cpu", grouped_sdp=_sdp_takes_groups(device),
                           grouped_sdp_masked=_sdp_takes_groups(device, masked=True),
                           fp8_rowwise=_scaled_mm_runs(device, rowwise=True), triton=triton)
    if device.type != "cuda":
        return DeviceFacts(device.type)
    properties = torch.cuda.get_device_properties(device)
    capability = (properties.major, properties.minor)
    rocm = torch.version.hip is not None
    triton = triton and (rocm or capability >= (7, 0))
    record = DeviceFacts("cuda", capability, rocm, torch._C._get_flash_sdp_enabled(), triton=triton)
    if rocm or capability < (8, 9):  # no e4m3fn GEMMs (ROCm's fp8 is e4m3fnuz)
        return record
    fp4_card = capability[0] in (10, 12) and FP4 is not None
    if torch.compiler.is_compiling():  # the documented rule until an eager call probes
        return DeviceFacts("cuda", capability, rocm, record.flash_sdp, fp8_tensorwise=True,
                           fp8_rowwise=capability >= (9, 0) and capability[0] != 12, triton=triton, fp4=fp4_card)
    return DeviceFacts("cuda", capability, rocm, record.flash_sdp, fp8_tensorwise=_scaled_mm_runs(device, False),
                       fp8_rowwise=_scaled_mm_runs(device, True), triton=triton,
                       fp4=fp4_card and _fp4_mm_runs(device))


def _sdp_takes_groups(device: torch.device, masked: bool = False) -> bool:
    """Whether SDPA picks a fused kernel (not math) for grouped K/V here: torch's own choice, asked of tiny inputs."""
    q = torch.zeros(1, 4, 8, 64, device=device)
    kv = torch.zeros(1, 2, 8, 64, device=device)
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool, device=device) if masked else None
    try:
        choice = torch._fused_sdp_choice(q, kv, kv, attn_mask=mask, enable_gqa=True)
    except (RuntimeError, TypeError, AttributeError):  # a torch without grouped SDPA
        return False
    return choice != int(torch.nn.attention.SDPBackend.MATH)


def _scaled_mm_runs(device: torch.device, rowwise: bool) -> bool:
    """One tiny fp8 matmul: cuBLAS refuses row-wise scales on some cards that have fp8 GEMMs (compute capability 12.x:
    RTX 50xx, RTX PRO Blackwell, CUBLAS_STATUS_NOT_SUPPORTED), which the capability alone does not tell."""
    a = torch.zeros(16, 16, device=device).to(FP8)
    b = torch.zeros(16, 16, device=device).to(FP8).t()
    if rowwise:
        scale_a, scale_b = torch.ones(16, 1, device=device), torch.ones(1, 16, device=device)
    else:
        scale_a = scale_b = torch.ones((), device=device)
    try:
        torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError):  # (a torch without a CPU kernel raises NotImplementedError)
        return False


def _fp4_mm_runs(device: torch.device) -> bool:
    """One tiny NVFP4 matmul (128 x 64 by 64 x 128, its scales in cuBLAS's 128 x 4 tiles): torch builds and cards
    differ in which block-scaled kernels they ship, which the capability alone does not tell."""
    a = torch.zeros(128, 32, dtype=torch.uint8, device=device).view(FP4)
    scales = torch.ones(128 * 4, device=device).to(FP8)
    try:
        torch._scaled_mm(a, a.t(), scales, scales, out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError, ValueError):
        return False


def _host_cache_emptier():
    """Returns PyTorch's cached pinned host memory to the system: `torch.accelerator.empty_host_cache` (torch 2.12+),
    else the host allocator's own call (earlier releases), else nothing to call."""
    accelerator = getattr(torch, "accelerator", None)
    return getattr(accelerator, "empty_host_cache", None) or getattr(torch._C, "_host_emptyCache", None)


_EMPTY_HOST_CACHE = _host_cache_emptier()


def empty_host_cache() -> None:
    """Give cached pinned host memory (a released block swap's or text offload's) back to the system."""
    if _EMPTY_HOST_CACHE is not None:
        _EMPTY_HOST_CACHE()
