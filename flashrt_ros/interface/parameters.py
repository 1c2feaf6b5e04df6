"""What a parameter is: one declaration with its type, default, range or choices and description,
the checks every value goes through, and the typed config made from a table of them.

Why a declaration: the same entry declares the ROS parameter (with a descriptor, so
``ros2 param describe`` explains it: ``ros/parameters.py``), fills a typed config, validates every
value (``check_value``: the node's set-parameter callback, configure, the tests of the YAML files
in config/), and writes the docs tables (``python -m flashrt_ros.interface.generate``). The tables
are ``node_params.PARAMS``, ``robot_io_params.ROBOT_IO_PARAMS`` and ``sim_params.SIM_PARAMS``; each
has its config class (``config_class``): a dataclass whose fields are the table's, typed from it,
so code reads ``config.default_tier``, never a parameter by its name.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ParamDef:
    """One parameter. ``array_of``: an array parameter of that element type (``default`` a list)."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    choices: tuple[str, ...] | None = None
    array_of: type | None = None

    @property
    def kind(self) -> type:
        """The value's type: bool, int, float, str, or list (an array)."""
        return list if self.array_of is not None else type(self.default)

    @property
    def field_type(self) -> Any:
        """Its type in a config class (an array is a tuple there)."""
        return tuple[self.array_of, ...] if self.array_of is not None else self.kind

    def typed(self, value: Any) -> Any:
        """``value`` as a config holds it: an array (or an unset one, None) as a tuple."""
        return tuple(value or ()) if self.array_of is not None else value


def _is_a(kind: type, value: Any) -> bool:
    """``value`` has ``kind`` as ROS types it (no int for a double, no bool for an integer)."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_value(p: ParamDef, value: Any) -> str | None:
    """A reason why ``value`` is not acceptable for ``p`` (type, choices, range), or None."""
    if p.array_of is not None:
        if not isinstance(value, (list, tuple, array)) or not all(_is_a(p.array_of, v) for v in value):
            return f"{p.name} must be a list of {p.array_of.__name__} (got {value!r})"
        return None
    if not _is_a(p.kind, value):
        return f"{p.name} must be a {p.kind.__name__} (got {value!r})"
    if p.choices and value not in p.choices:
        return f"{p.name} must be one of {', '.join(p.choices)} (got {value!r})"
    bounds = p.int_range or p.float_range
    if bounds and not bounds[0] <= value <= bounds[1]:
        return f"{p.name} must be in {bounds[0]}..{bounds[1]} (got {value!r})"
    return None


def first_problem(params: Iterable[ParamDef], values: dict[str, Any]) -> str | None:
    """The first reason why one of ``values`` (by parameter name) is refused, or None."""
    return next(filter(None, (check_value(p, values[p.name]) for p in params if p.name in values)), None)


def config_class(name: str, params: tuple[ParamDef, ...], doc: str, *, defaults: bool = False) -> type:
    """A frozen dataclass with one field per parameter of ``params``, typed from the table (arrays
    as tuples); with ``defaults``, each field's default is the table's. ``config_from`` fills one."""
    def spec(p: ParamDef) -> tuple[str, Any, Any]:
        default = field(default=p.typed(p.default)) if defaults else field()
        return p.name, p.field_type, default

    cls = make_dataclass(name, [spec(p) for p in params], frozen=True, namespace={"__doc__": doc})
    cls.PARAMS = params
    return cls


def config_from(cls: type, values: dict[str, Any], *, check: bool = True) -> Any:
    """A ``cls`` (from ``config_class``) of ``values`` by parameter name (an unset array: None).

    ``check``: refuse, with ``ValueError`` and the reason, a value of the wrong type, outside its
    choices or range; without it the values are taken as they are (the node's configure checks
    them itself and fails the transition with the reason instead).
    """
    typed = {p.name: p.typed(values[p.name]) for p in cls.PARAMS}
    reason = first_problem(cls.PARAMS, typed) if check else None
    if reason:
        raise ValueError(reason)
    return cls(**typed)
