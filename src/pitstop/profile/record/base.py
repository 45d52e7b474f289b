"""What every typed record of a measurements record shares (``record.measurements``, ``record.parts``):
JSON in and out by its fields' names, a key it does not name kept in its ``extra`` mapping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """JSON in and out, by the fields' names. ``NESTED``: fields holding a sequence of records, by the
    record class each item is read into; ``ONE``: fields holding one record. A field left at None is left
    out of ``to_json``, except the names in a record's ``nulls``: those its JSON held as null
    (``KEEP_NULLS``) or that ``build`` was given as None, so the writer's nulls are written again."""

    NESTED: ClassVar[dict[str, type[Record]]] = {}
    ONE: ClassVar[dict[str, type[Record]]] = {}
    OWN: ClassVar[frozenset[str]] = frozenset({"extra", "absent", "nulls"})  # fields that are no JSON key
    KEEP_NULLS: ClassVar[bool] = True
    extra: Mapping[str, Any]

    @classmethod
    def build(cls: type[R], **kw: Any) -> R:
        """The record of these fields, those given as None written as null by ``to_json`` (where the
        record has ``nulls``): the writer's side, whose JSON names every key it wrote."""
        if "nulls" in {f.name for f in fields(cls)}:
            kw["nulls"] = frozenset(k for k, v in kw.items() if v is None)
        return cls(**kw)

    @classmethod
    def from_json(cls: type[R], d: Mapping[str, Any] | None) -> R:
        d = d or {}
        own = {f.name for f in fields(cls)}
        names = own - cls.OWN
        kw: dict[str, Any] = {}
        for k in names & d.keys():
            kw[k] = _read(cls, k, d[k])
        if cls.NESTED:  # a sequence the JSON did not hold is empty here and left out again by to_json
            kw["absent"] = frozenset(cls.NESTED) - d.keys()
        if "nulls" in own and cls.KEEP_NULLS:
            kw["nulls"] = frozenset(k for k in names & d.keys() if d[k] is None)
        return cls(**kw, extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def of(cls: type[R], data: R | Mapping[str, Any] | None) -> R:
        """``data`` as this record: itself where it is one, else read from its JSON mapping."""
        return data if isinstance(data, cls) else cls.from_json(data)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        nulls = getattr(self, "nulls", ())
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in self.OWN or f.name in getattr(self, "absent", ()):
                continue
            if v is None:
                if f.name in nulls:
                    out[f.name] = None
                continue
            out[f.name] = _write(self, f.name, v)
        out.update(self.extra)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """Mapping access by JSON key, for code that takes the record as a mapping."""
        return self.to_json().get(key, default)


def _read(cls: type[Record], k: str, v: Any) -> Any:
    if (sub := cls.NESTED.get(k)) is not None:
        return tuple(sub.from_json(x) for x in v or ())
    if (one := cls.ONE.get(k)) is not None and v is not None:
        return one.from_json(v)
    return v


def _write(rec: Record, k: str, v: Any) -> Any:
    if k in rec.NESTED:
        return [x.to_json() for x in v]
    if k in rec.ONE:
        return v.to_json()
    return v
