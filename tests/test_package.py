"""The package surface: every public name resolves, the list of exports is the one in __all__."""

from __future__ import annotations

from conftest import run_python

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
