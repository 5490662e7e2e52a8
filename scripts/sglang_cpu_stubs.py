"""Inert stand-ins for `triton` and `torchvision`, so SGLang's scheduler modules import on CPU.

Installed into the SGLang CPU venv by `scripts/build_sglang_env.sh` with a `.pth` line that
imports this module. The finder is appended to the END of `sys.meta_path`: a real `triton` or
`torchvision`, if one is ever installed, always wins. Only imports are served: decorators return
kernels that raise when launched, functions raise when called (a kernel or a vision transform
running here would be a bug, and should fail loudly, not compute nonsense).

Why stubs: triton is ~1 GB of CUDA tooling, and the PyPI torchvision wheel is linked against
CUDA torch and fails to load next to the CPU torch wheel. SGLang 0.5.23 imports both at module
level on the scheduler's import path, but never calls them on our code paths.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

_ROOTS = ("triton", "torchvision")
_CLASSES: dict[str, type] = {}


class Stub:
    """Any attribute is another stub; calling one raises (nothing may run here)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        return _attr(self._name, item)

    def __getitem__(self, item: Any) -> Stub:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: a CPU import stub (scripts/sglang_cpu_stubs.py)")

    def __repr__(self) -> str:
        return f"<cpu stub {self._name}>"


class Kernel(Stub):
    """What `@triton.jit` and friends return: importable, subscriptable, never launchable."""

    def __init__(self, fn: Any) -> None:
        super().__init__(f"triton kernel {getattr(fn, '__name__', fn)!s}")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)


def _decorator(*args: Any, **kwargs: Any) -> Any:
    """`@jit`, `@jit(...)`, `@autotune(...)`, `@heuristics(...)`."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn = args[0]
        return fn if isinstance(fn, Kernel) else Kernel(fn)
    return _decorator


def _constexpr(value: Any = None) -> Any:
    return value


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


_TRITON_NAMES: dict[str, Any] = {
    "jit": _decorator,
    "autotune": _decorator,
    "heuristics": _decorator,
    "constexpr": _constexpr,
    "cdiv": _cdiv,
    "next_power_of_2": _next_power_of_2,
    "__version__": "3.4.0",
}


def _attr(module: str, item: str) -> Any:
    if module.startswith("triton") and item in _TRITON_NAMES:
        return _TRITON_NAMES[item]
    qual = f"{module}.{item}"
    if module.startswith("triton") and item[:1].isupper():
        # triton's class-like names resolve to real (empty) classes, so isinstance() and
        # subclassing work; torchvision's (enums such as InterpolationMode) stay stubs.
        if qual not in _CLASSES:
            _CLASSES[qual] = type(item, (), {"__init__": lambda self, *a, **k: None})
        return _CLASSES[qual]
    return Stub(qual)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] in _ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        name = spec.name

        def __getattr__(item: str) -> Any:
            if item.startswith("__") and item != "__version__":
                raise AttributeError(item)
            if item == "__version__":
                return "3.4.0" if name.startswith("triton") else "0.0.0+cpustub"
            return _attr(name, item)

        mod.__getattr__ = __getattr__  # type: ignore[method-assign]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


install()
