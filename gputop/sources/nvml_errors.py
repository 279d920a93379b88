"""NVML's errors in words: why a value is missing, whether asking again can help, and what to
tell the user when NVML cannot start. Also the one ``pynvml`` import the NVML modules share (None
on a broken install: the source reports it instead of failing the import)."""

from __future__ import annotations

try:
    import pynvml as nv
except ImportError:  # a broken install: the source reports it instead of failing the import
    nv = None

NO_DRIVER_TAIL = "GPU panels are off; host and Python panels still work"


def _err_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None) if nv is not None and isinstance(exc, nv.NVMLError) else None


def _code(name: str) -> int | None:
    return getattr(nv, name, None) if nv is not None else None


def _is_too_old(exc: BaseException) -> bool:
    """The driver (or the bindings) lack this call or this struct version."""
    if isinstance(exc, AttributeError):
        return True
    if nv is not None and isinstance(exc, nv.NVMLLibraryMismatchError):
        return True
    return _err_code(exc) in (_code("NVML_ERROR_FUNCTION_NOT_FOUND"), _code("NVML_ERROR_ARGUMENT_VERSION_MISMATCH"))


def nvml_reason(exc: BaseException) -> str:
    """A short phrase for why a value is missing (for gpu_info.na and health messages)."""
    if isinstance(exc, AttributeError):
        return "nvidia-ml-py too old"
    if _is_too_old(exc):
        return "driver too old"
    code = _err_code(exc)
    if code is None:
        return f"{type(exc).__name__}: {exc}"[:120]
    phrases = {
        "NVML_ERROR_NOT_SUPPORTED": "not supported",
        "NVML_ERROR_NO_PERMISSION": "no permission",
        "NVML_ERROR_LIBRARY_NOT_FOUND": "no driver",
        "NVML_ERROR_DRIVER_NOT_LOADED": "no driver",
        "NVML_ERROR_GPU_IS_LOST": "GPU is lost",
        "NVML_ERROR_NOT_FOUND": "not found",
        "NVML_ERROR_INVALID_ARGUMENT": "not supported by this driver",
        "NVML_ERROR_TIMEOUT": "timed out",
        "NVML_ERROR_UNINITIALIZED": "NVML not initialised",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver/library version mismatch",
        "NVML_ERROR_NO_DATA": "no data",
        "NVML_ERROR_NOT_READY": "not ready",
        "NVML_ERROR_INSUFFICIENT_POWER": "insufficient external power",
        "NVML_ERROR_RESET_REQUIRED": "GPU needs a reset",
        "NVML_ERROR_DEPRECATED": "removed from this driver",
        "NVML_ERROR_UNKNOWN": "unknown NVML error",
    }
    for name, phrase in phrases.items():
        if code == _code(name):
            return phrase
    return f"NVML error {code}"


def is_permanent(exc: BaseException) -> bool:
    """Will asking again give a different answer? Permanent failures stop being asked for and
    go into gpu_info.na; others are counted as transient errors in the health sample."""
    if _is_too_old(exc):
        return True
    return _err_code(exc) in (_code("NVML_ERROR_NOT_SUPPORTED"), _code("NVML_ERROR_NO_PERMISSION"),
                              _code("NVML_ERROR_INVALID_ARGUMENT"), _code("NVML_ERROR_DEPRECATED"))


def init_failure_message(exc: BaseException) -> str:
    """One line for the user when NVML cannot start at all."""
    code = _err_code(exc)
    if code == _code("NVML_ERROR_LIBRARY_NOT_FOUND"):
        return f"no NVIDIA driver (libnvidia-ml.so.1 not found): {NO_DRIVER_TAIL}"
    if code == _code("NVML_ERROR_DRIVER_NOT_LOADED"):
        return f"NVIDIA driver not loaded (is the nvidia kernel module in?): {NO_DRIVER_TAIL}"
    if code == _code("NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return ("NVIDIA driver and libnvidia-ml versions differ (driver upgraded without a reboot?): "
                f"{NO_DRIVER_TAIL}")
    if code == _code("NVML_ERROR_NO_PERMISSION"):
        return f"no permission to use the NVIDIA driver (/dev/nvidia*): {NO_DRIVER_TAIL}"
    return f"NVML could not start ({nvml_reason(exc)}): {NO_DRIVER_TAIL}"
