"""Which nodes a pass added, changed or removed: a structural match of two Graphs.

Passes go through jaxprs (`run_passes` rebuilds the Graph per pass), so the
before and after graphs share no Value objects. We match them as CSE would:
a plain node corresponds to a before-node with the same primitive, params and
(corresponding) operands, or failing that with the same primitive, params,
result types and user source line (its operands were rewired); a node with bodies (scan, while, cond, jit, ...)
corresponds to the before-node of the same primitive at the same user source
line, and its bodies are matched recursively: a body input corresponds to one
fed by the corresponding operand in the same role (const/carry/xs), the
remaining ones by type and order.
What has no counterpart is *new* (after) or *removed* (before). The match is
a heuristic for showing changes (a miss only over-highlights); it never
affects the program.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..ir import Graph, Node, Value


@dataclass
class Match:
    names: dict = field(default_factory=dict)     # after Value.id -> corresponding before Value
    new: set = field(default_factory=set)         # id(node) of after nodes that are new or changed
    removed: set = field(default_factory=set)     # id(node) of before nodes with no counterpart
    new_nodes: list = field(default_factory=list)
    removed_nodes: list = field(default_factory=list)

    def is_new(self, node: Node) -> bool:
        return id(node) in self.new

    def is_removed(self, node: Node) -> bool:
        return id(node) in self.removed

    def _add(self, node: Node, new: bool):
        (self.new if new else self.removed).add(id(node))
        (self.new_nodes if new else self.removed_nodes).append(node)


def match(before: Graph, after: Graph) -> Match:
    m = Match()
    _by_type(before.inputs, after.inputs, m)
    _graph(before, after, m)
    return m


def _params_key(node: Node) -> str:
    return repr(sorted(node.params.items(), key=lambda kv: kv[0]))


def _lit_key(v: Value):
    return ("lit", repr(v.literal), str(v.aval))


def _by_type(vs_before, vs_after, m: Match) -> None:
    """Pair still-unpaired values of the same type in order (the i-th f32[3] before with the i-th after)."""
    paired = {v.id for v in m.names.values()}
    pool = collections.defaultdict(collections.deque)
    for v in vs_before:
        if v.id not in paired:
            pool[str(v.aval)].append(v)
    for v in vs_after:
        if v.id not in m.names and pool[str(v.aval)]:
            m.names[v.id] = pool[str(v.aval)].popleft()


def _bkey(v: Value):
    return _lit_key(v) if v.is_literal else ("v", v.id)


def _akey(v: Value, m: Match):
    return _lit_key(v) if v.is_literal else ("v", m.names[v.id].id) if v.id in m.names else ("new", v.id)


def _feeds(n: Node, region: str, sub: Graph) -> list | None:
    """(role, operand) feeding each input of a body of `n`, when known (loops, cond, calls)."""
    ops, k = n.inputs, len(sub.inputs)
    if n.name == "scan":
        c, carry = n.params["num_consts"], n.params["num_carry"]
        idx, role = range(len(ops)), lambda j: "const" if j < c else "carry" if j < c + carry else "xs"
    elif n.name == "while":
        c, b = n.params["cond_nconsts"], n.params["body_nconsts"]
        idx = [*range(c), *range(c + b, len(ops))] if region == "cond" else range(c, len(ops))
        role = lambda j: "const" if j < c + b else "carry"  # noqa: E731
    elif n.name == "cond":
        idx, role = range(1, len(ops)), lambda j: "op"
    else:
        idx, role = range(len(ops)), lambda j: "op"
    return [(role(j), ops[j]) for j in idx] if len(idx) == k else None


def _body_inputs(b: Graph, a: Graph, feeds_b, feeds_a, m: Match) -> None:
    """Body inputs fed by corresponding operands in the same role correspond; the rest by type."""
    if feeds_b is not None and feeds_a is not None:
        pool = collections.defaultdict(collections.deque)
        for v, (role, op) in zip(b.inputs, feeds_b):
            pool[(role, _bkey(op))].append(v)
        for v, (role, op) in zip(a.inputs, feeds_a):
            if pool[(role, _akey(op, m))]:
                m.names[v.id] = pool[(role, _akey(op, m))].popleft()
    _by_type(b.inputs, a.inputs, m)


def _graph(b: Graph, a: Graph, m: Match) -> None:
    consts = {id(v.const): v for v in b.consts}
    for v in a.consts:
        if id(v.const) in consts:
            m.names[v.id] = consts[id(v.const)]
    bkey, akey = _bkey, lambda v: _akey(v, m)  # noqa: E731
    plain, moved, nested = (collections.defaultdict(collections.deque) for _ in range(3))
    taken: set = set()
    for n in b.nodes:
        if n.regions:
            nested[(n.name, n.location())].append(n)
        else:
            plain[(n.name, _params_key(n), tuple(map(bkey, n.inputs)))].append(n)
            moved[_rewired_key(n)].append(n)

    def pop(q):
        while q and id(q[0]) in taken:
            q.popleft()
        if q:
            taken.add(id(q[0]))
            return q.popleft()

    for n in a.nodes:
        if not n.regions:
            # the same operation on corresponding operands; else the same operation from the same
            # source line with the same type, whose operands were rewired (not new: not highlighted)
            old = pop(plain[(n.name, _params_key(n), tuple(map(akey, n.inputs)))]) or pop(moved[_rewired_key(n)])
            if old is not None:
                for x, y in zip(n.outputs, old.outputs):
                    m.names[x.id] = y
            else:
                m._add(n, True)
            continue
        cands = nested[(n.name, n.location())]
        if not cands:
            _all(n, m, True)
            continue
        old = cands.popleft()
        seen = len(m.new) + len(m.removed)
        for name, r in n.regions.items():
            subs_a = r if isinstance(r, tuple) else (r,)
            rb = old.regions.get(name, ())
            subs_b = rb if isinstance(rb, tuple) else (rb,)
            for i, sa in enumerate(subs_a):
                if i < len(subs_b):
                    _body_inputs(subs_b[i], sa, _feeds(old, name, subs_b[i]), _feeds(n, name, sa), m)
                    _graph(subs_b[i], sa, m)
                else:
                    for x, _ in sa.walk():
                        m._add(x, True)
        _by_type(old.outputs, n.outputs, m)
        if (len(m.new) + len(m.removed) != seen or _params_key(n) != _params_key(old)
                or tuple(map(akey, n.inputs)) != tuple(map(bkey, old.inputs))):
            m._add(n, True)
    for left in (*plain.values(), *nested.values()):
        for n in left:
            if id(n) not in taken:
                _all(n, m, False)


def _rewired_key(n: Node):
    return (n.name, _params_key(n), n.location(), tuple(str(o.aval) for o in n.outputs))


def _all(node: Node, m: Match, new: bool) -> None:
    m._add(node, new)
    for g in node.subgraphs():
        for x, _ in g.walk():
            m._add(x, new)
