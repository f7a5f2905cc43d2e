"""The package surface: every public name resolves, the list of exports is the one in __all__."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from helpers import run_python

import kernelcache


def test_every_export_resolves_and_all_agrees() -> None:
    assert sorted(kernelcache.__all__) == sorted(kernelcache._EXPORTS)
    for name in kernelcache.__all__:
        assert getattr(kernelcache, name) is not None


def test_importing_the_package_loads_no_compiler_machinery() -> None:
    out = run_python(
        "import sys, kernelcache\nprint(sorted(m for m in sys.modules if m.startswith(('kernelcache.', 'cuda'))))\n"
    )
    assert out.strip() == "[]"


def test_py_typed_is_shipped() -> None:
    import os

    assert os.path.exists(os.path.join(os.path.dirname(kernelcache.__file__), "py.typed"))


@pytest.mark.parametrize(
    ("module", "needs", "extra"), [("kernelcache.cupy", "cupy", "cupy"), ("kernelcache.triton", "triton", "triton")]
)
def test_an_integration_without_its_extra_is_a_module_not_found_error(module: str, needs: str, extra: str) -> None:
    # pytest.importorskip (9.x) skips only a ModuleNotFoundError: a plain ImportError made
    # the suite fail on a machine without the extra.
    if importlib.util.find_spec(needs) is not None:
        pytest.skip(f"{needs} is installed here")
    with pytest.raises(ModuleNotFoundError, match=rf"kernelcache\[{extra}\]"):
        importlib.import_module(module)
    # and so importorskip skips it, whatever its default:
    with pytest.raises(pytest.skip.Exception):
        pytest.importorskip(module, exc_type=ModuleNotFoundError)
