"""CompileRequest: what one compile is asked for, built once per call and passed down whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from kernelcache.keys.derive import code_bytes, default_options

if TYPE_CHECKING:
    from cuda.core import ProgramOptions

_new_tuple = tuple.__new__


class CompileRequest(NamedTuple):
    """compile_program's compiler arguments, filled in: every layer reads them from here.

    Immutable (a NamedTuple: built in a fraction of a microsecond, which the hit path feels).

    ``code_type``/``target_type`` are lower-cased when they are str, ``options`` is
    cuda.core's default ProgramOptions when none were given, ``name_expressions`` is a
    tuple. Nothing else is checked here: the key (keys.derive) validates every field and
    raises naming the wrong one. ``options`` is the caller's object, not a copy: the key
    memo keys it by its values, so an options object mutated between calls is a new key.
    """

    code: str | bytes
    code_type: str = "c++"
    target_type: str = "cubin"
    options: ProgramOptions = None  # type: ignore[assignment]  # filled in by of()
    name_expressions: tuple[str | bytes, ...] = ()
    extra_digest: bytes | None = None

    @classmethod
    def of(
        cls,
        code: str | bytes,
        code_type: str = "c++",
        target_type: str = "cubin",
        options: ProgramOptions | None = None,
        name_expressions: Sequence[str | bytes] = (),
        extra_digest: bytes | None = None,
    ) -> CompileRequest:
        """The request for these compile_program arguments (TypeError for a lone str/bytes name)."""
        if type(name_expressions) is not tuple:
            if isinstance(name_expressions, (str, bytes)):
                raise TypeError("name_expressions must be a sequence of names, not a single str/bytes")
            name_expressions = tuple(name_expressions)
        # tuple.__new__ directly: the generated __new__ (defaults, keywords) costs 1 us per call.
        return _new_tuple(
            cls,
            (
                code,
                code_type.lower() if isinstance(code_type, str) else code_type,
                target_type.lower() if isinstance(target_type, str) else target_type,
                default_options() if options is None else options,
                name_expressions,
                extra_digest,
            ),
        )

    @classmethod
    def from_mapping(cls, fields: dict[str, Any]) -> CompileRequest:
        """The request for one compile_many request (a mapping of compile_program's arguments)."""
        return cls.of(
            fields["code"],
            fields.get("code_type", "c++"),
            fields.get("target_type", "cubin"),
            fields.get("options"),
            fields.get("name_expressions", ()),
            fields.get("extra_digest"),
        )

    def source_bytes(self) -> bytes:
        """The source as the bytes the key hashes (str as UTF-8, surrogates passed through)."""
        return code_bytes(self.code)
