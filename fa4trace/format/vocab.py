"""The one event vocabulary shared by kernels, decoder, exporters, analysis and app.

A kernel records events by numeric id (a compile-time constant, 1..255); everything
downstream speaks names. Each bundle stores the vocabulary it was decoded with, so a trace
that uses kernel-registered events still opens on a machine that never saw that kernel.

Events placed automatically by ``fa4trace.instrument`` (any CuTe DSL kernel) are registered per
kernel at compile time, one id per (family, op, resource): ``family`` is "pipeline", "tma",
"mma" or "barrier"; ``op`` what the call did (acquire, commit, wait, release; load, store;
commit, issue, wait; sync, arrive); ``resource`` the pipeline's name or the barrier id; ``stages`` a
pipeline's stage count. Their payload (``iter``) is the pipeline state's running count (stage =
count % stages) or the wgmma groups left in flight (mma wait) or the barrier id. Their names
read ``resource.op`` (``ab.wait``) or ``family.op`` (``tma.load``, ``mma.wait``).

``sync`` events are work the recording warp itself does (SOFTMAX, LOAD_K issue...):
they nest on the warp's own track. ``async`` events are work the warp started and later
waited for (QK in flight from wgmma issue to wait): on Hopper they overlap the same warp's
SOFTMAX, so exporters and the app draw them on a child track of their own.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Iterable

from .errors import TraceFormatError

WAIT_OPS = frozenset({"acquire", "wait", "sync", "store_wait"})  # automatic ops during which a warp waits
FAMILIES = ("pipeline", "tma", "mma", "barrier", "user")  # fa4trace.instrument's event families
WARP_EVENT_ID = 0  # reserved: the decoder emits one WARP row per warp lifetime
MAX_EVENT_ID = 255  # the record keeps 8 bits of event id


@dataclass(frozen=True)
class EventSpec:
    name: str
    id: int
    role: str  # the role that normally records it ("" = any)
    is_async: bool
    color: str  # CSS hex, used by the viewer (the Chrome/Perfetto exports leave colors to their UIs)
    description: str = ""
    family: str = ""  # automatic events: pipeline | tma | mma | barrier ("" = hand-placed)
    op: str = ""  # automatic events: what the hooked call did (wait, acquire, commit, ...)
    resource: str = ""  # automatic events: the pipeline's name or the barrier id
    stages: int = 0  # automatic pipeline events: the pipeline's stage count

    @property
    def is_wait(self) -> bool:
        """A span in which the warp waits for another warp or unit (automatic events)."""
        return self.op in WAIT_OPS


@dataclass(frozen=True)
class RoleSpec:
    name: str
    id: int
    description: str = ""


_ROLES = [
    RoleSpec("unknown", 0, "warp recorded without a role"),
    RoleSpec("producer", 1, "TMA / load warp: brings Q, K, V into shared memory"),
    RoleSpec("consumer", 2, "Hopper warpgroup that issues wgmma and runs softmax"),
    RoleSpec("mma", 3, "Blackwell warp that issues tcgen05 MMAs"),
    RoleSpec("softmax", 4, "Blackwell softmax warpgroup"),
    RoleSpec("correction", 5, "rescales the output accumulator"),
    RoleSpec("epilogue", 6, "writes O / LSE"),
    RoleSpec("combine", 7, "split-KV combine"),
    RoleSpec("calibration", 8, "timer calibration kernel"),
    RoleSpec("bench", 9, "marker microbenchmark"),
    RoleSpec("idle", 10, "warp with no work in this kernel"),
]

# Colors: a qualitative palette with loads in blues, tensor-core work in oranges/reds,
# softmax in green so that "green under orange" reads as overlap at a glance, and the consumer's
# stalls in pinks (WAIT_K light, WAIT_V deep), apart from softmax and from each other.
_EVENTS = [
    EventSpec("WARP", WARP_EVENT_ID, "", False, "#d9d9d9", "lifetime of a warp (decoder-made)"),
    EventSpec("LOAD_Q", 1, "producer", False, "#9ecae1", "Q tile load issued until it landed"),
    EventSpec("LOAD_K", 2, "producer", False, "#3182bd", "K block load: wait for a free stage, issue"),
    EventSpec("LOAD_V", 3, "producer", False, "#6baed6", "V block load: wait for a free stage, issue"),
    EventSpec("QK", 4, "consumer", True, "#e6550d", "S = Q K^T in flight: MMA issue to completion"),
    EventSpec("SOFTMAX", 5, "consumer", False, "#31a354", "online softmax of one S block"),
    EventSpec("CORRECTION", 6, "consumer", False, "#fdae6b", "rescale of O by exp(m_old - m_new)"),
    EventSpec("PV", 7, "consumer", True, "#a63603", "O += P V in flight: MMA issue to completion"),
    EventSpec("EPILOGUE", 8, "epilogue", False, "#756bb1", "normalize and store O (and LSE)"),
    EventSpec("COMBINE", 9, "combine", False, "#bcbddc", "LSE-weighted combine of split-KV partials"),
    EventSpec("WAIT_K", 10, "consumer", False, "#fa9fb5", "consumer waits for a K block to land"),
    EventSpec("WAIT_V", 11, "consumer", False, "#c51b8a", "consumer waits for a V block to land"),
    EventSpec("MARK", 12, "", False, "#636363", "generic instant / span"),
    EventSpec("CALIB", 13, "calibration", False, "#fd8d3c", "calibration sample"),
    EventSpec("BENCH", 14, "bench", False, "#bdbdbd", "microbenchmark marker"),
    EventSpec("ANCHOR", 255, "", False, "#000000", "clock/globaltimer anchor pair (decoder-internal, never a row)"),
]


class Vocabulary:
    """Events and roles by id and by name; registering more is allowed, clashes are not."""

    def __init__(self, events: Iterable[EventSpec] = (), roles: Iterable[RoleSpec] = ()):
        self._events: dict[int, EventSpec] = {}
        self._events_by_name: dict[str, EventSpec] = {}
        self._roles: dict[int, RoleSpec] = {}
        self._roles_by_name: dict[str, RoleSpec] = {}
        for r in roles:
            self.register_role(r.name, r.id, r.description)
        for e in events:
            self.register(e.name, e.id, role=e.role, is_async=e.is_async, color=e.color,
                          description=e.description, family=e.family, op=e.op, resource=e.resource,
                          stages=e.stages)

    # ---- registration -------------------------------------------------------------------
    def register(self, name: str, id: int, *, role: str = "", is_async: bool = False,
                 color: str = "#969696", description: str = "", family: str = "", op: str = "",
                 resource: str = "", stages: int = 0) -> EventSpec:
        if not (0 <= int(id) <= MAX_EVENT_ID):
            raise ValueError(f"event id {id} for {name!r} is outside 0..{MAX_EVENT_ID}")
        if not name or not all(p.replace("_", "").isalnum() for p in name.split(".")):
            raise ValueError(f"event name {name!r} must be identifiers joined by dots")
        if family and family not in FAMILIES:
            raise ValueError(f"event family {family!r} is not one of {FAMILIES}")
        spec = EventSpec(name, int(id), role, bool(is_async), color, description, family, op, resource,
                         int(stages))
        old = self._events.get(spec.id) or self._events_by_name.get(name)
        if old is not None:
            if old == spec:
                return old
            raise ValueError(f"event {name!r} (id {id}) clashes with registered {old.name!r} (id {old.id})")
        self._events[spec.id] = spec
        self._events_by_name[name] = spec
        return spec

    def register_role(self, name: str, id: int, description: str = "") -> RoleSpec:
        if not (0 <= int(id) <= 0xFFFF):
            raise ValueError(f"role id {id} for {name!r} is outside 0..65535")
        spec = RoleSpec(name, int(id), description)
        old = self._roles.get(spec.id) or self._roles_by_name.get(name)
        if old is not None:
            if old == spec:
                return old
            raise ValueError(f"role {name!r} (id {id}) clashes with registered {old.name!r} (id {old.id})")
        self._roles[spec.id] = spec
        self._roles_by_name[name] = spec
        return spec

    # ---- lookup -------------------------------------------------------------------------
    def event(self, key: int | str) -> EventSpec:
        table = self._events_by_name if isinstance(key, str) else self._events
        try:
            return table[key]
        except KeyError:
            raise KeyError(f"unknown event {key!r}") from None

    def role(self, key: int | str) -> RoleSpec:
        table = self._roles_by_name if isinstance(key, str) else self._roles
        try:
            return table[key]
        except KeyError:
            raise KeyError(f"unknown role {key!r}") from None

    @property
    def events(self) -> list[EventSpec]:
        return sorted(self._events.values(), key=lambda e: e.id)

    @property
    def roles(self) -> list[RoleSpec]:
        return sorted(self._roles.values(), key=lambda r: r.id)

    def event_names(self) -> list[str]:
        """Names indexed by id (empty string where no event has that id), for vectorized lookup."""
        names = [""] * (MAX_EVENT_ID + 1)
        for e in self._events.values():
            names[e.id] = e.name
        return names

    def role_names(self) -> dict[int, str]:
        return {r.id: r.name for r in self._roles.values()}

    def async_names(self) -> set[str]:
        return {e.name for e in self._events.values() if e.is_async}

    def colors(self) -> dict[str, str]:
        return {e.name: e.color for e in self._events.values()}

    def copy(self) -> "Vocabulary":
        return Vocabulary(self.events, self.roles)

    # ---- serialization (stored in each bundle) ------------------------------------------
    def to_json(self) -> dict:
        return {"events": [asdict(e) for e in self.events], "roles": [asdict(r) for r in self.roles]}

    @classmethod
    def from_json(cls, obj: dict) -> "Vocabulary":
        try:
            return cls([EventSpec(**e) for e in obj["events"]], [RoleSpec(**r) for r in obj["roles"]])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"bundle vocabulary is malformed: {exc}") from None

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


VOCAB = Vocabulary(_EVENTS, _ROLES)

# Compile-time constants for kernels: EV.QK, ROLE.CONSUMER ...
EV = SimpleNamespace(**{e.name: e.id for e in _EVENTS})
ROLE = SimpleNamespace(**{r.name.upper(): r.id for r in _ROLES})
