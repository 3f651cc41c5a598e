"""Checks that a tape computes the step the graph describes, and cannot hang.

A broken tape on a GPU is the worst failure a megakernel can have: a wait that is never satisfied
spins until its timeout, and a wait satisfied too early reads half-written activations. So every
tape is checked here, on the host, before a kernel sees it:

1. every instruction is well formed (a known op, a layer and tiles that exist, counters in range);
2. every tile of every stage of ``build_stages(plan)`` is scheduled exactly once;
3. every wait names a counter that instructions raise exactly ``wait_per_step`` times a step
   (fewer never satisfies it; more lets the next step's wait pass before its producers finish,
   because counters only grow);
4. the workers cannot deadlock: each worker runs its list in order, an instruction runs once its
   wait is satisfied, a BARRIER signals and then waits. The simulation names the stuck
   instructions, and for a cycle of waits, the cycle. Waits only ever become satisfied (counters
   grow), so if one interleaving finishes, every interleaving of co-resident workers does;
5. every instruction is ordered after the producers the graph says it needs: in ``megakernel``
   mode by waiting on a counter raised by all of them; in ``superkernel`` mode by a grid-wide
   BARRIER between them (or such a wait);
6. a stage with a pool (``ops`` module doc) claims it from a counter of its own, which nothing
   waits on or signals, with every instruction of the stage and the claims a step they make.

The same simulation measures the critical path in dependent steps (``dependent_steps``): the
longest chain of waits, each of which costs a cross-worker round trip on the device.
"""

from __future__ import annotations

from collections import defaultdict

from .graph import Tape, build_stages
from .kinds import KINDS
from .ops import Instr, Op, Plan

MAX_REPORTED = 5


class TapeError(ValueError):
    """The tape is malformed, misses or repeats a tile, orders a consumer before its producer, or
    can deadlock. The message names the offending instruction (worker, position, description)."""


def where(lists, w: int, i: int) -> str:
    return f"worker {w} position {i} ({lists[w][i].describe()})"


def _counter(names: dict, c: int) -> str:
    name = names.get(c)
    return f"counter {c} ({name})" if name else f"counter {c}"


def _fail(title: str, problems: list[str]):
    if problems:
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        raise TapeError(f"{title}: " + problems[0] + "".join(f"\n  {p}" for p in problems[1:MAX_REPORTED]) + more)


def _is_tape(tape) -> bool:
    return isinstance(tape, Tape) or all(hasattr(tape, a) for a in ("workers", "plan", "mode", "counter_names"))


def _unpack(tape, plan, mode, names):
    if _is_tape(tape):
        return tape.workers, tape.plan, tape.mode, tape.num_counters, dict(tape.counter_names)
    if plan is None:
        raise TypeError("validate(lists, plan): a raw list of instruction lists needs its plan")
    lists = [list(lst) for lst in tape]
    if mode is None:
        mode = "superkernel" if any(i.op == Op.BARRIER for lst in lists for i in lst) else "megakernel"
    return lists, plan, mode, None, dict(names or {})


def validate(tape, plan: Plan | None = None, mode: str | None = None, counter_names: dict | None = None) -> None:
    """Raise ``TapeError`` unless ``tape`` (a ``Tape``, or a list of per-worker ``Instr`` lists
    with its ``plan``) is correct and deadlock-free. For raw lists, ``mode`` is inferred (BARRIER
    instructions mean superkernel) and ``counter_names`` labels counters in messages."""
    lists, plan, mode, num_counters, names = _unpack(tape, plan, mode, counter_names)
    if mode not in ("megakernel", "superkernel"):
        raise TapeError(f"unknown tape mode {mode!r}")
    if not lists:
        raise TapeError("the tape has no workers")
    stages = build_stages(plan)
    _check_fields(lists, plan, num_counters)
    _check_coverage(lists, stages)
    _check_pools(lists, plan, names, num_counters)
    raisers = _check_counters(lists, names)
    _check_deadlock(lists, names)
    _check_dependencies(lists, stages, raisers, mode, names)


# ---------------------------------------------------------------------------------------------
# 1. fields


def _check_fields(lists, plan: Plan, num_counters):
    bad = []
    ntiles = {Op[k.name]: plan.tiles(k.opcode) for k in KINDS}
    per_layer = {Op[k.name]: k.stages_per_layer for k in KINDS if k.per_layer}
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if not isinstance(ins, Instr):
                raise TapeError(f"worker {w} position {i}: {ins!r} is not an Instr")
            try:
                op = Op(ins.op)
            except ValueError:
                bad.append(f"worker {w} position {i}: unknown opcode {ins.op}")
                continue
            what = where(lists, w, i)
            if op not in (Op.NOOP, Op.BARRIER):
                layers = plan.L * per_layer[op] if op in per_layer else 1
                if not 0 <= ins.layer < layers:
                    bad.append(f"{what}: layer {ins.layer} does not exist (0..{layers - 1})")
                n = ntiles[op]
                if not 0 <= ins.tile_start < ins.tile_end <= n:
                    bad.append(f"{what}: tiles [{ins.tile_start}, {ins.tile_end}) are not a non-empty "
                               f"range within the op's {n} tiles")
            elif op == Op.BARRIER and (ins.wait_per_step <= 0 or ins.signal_counter != ins.wait_counter):
                bad.append(f"{what}: a barrier must signal the counter it waits on, for a positive count "
                           f"(signal {ins.signal_counter}, wait {ins.wait_counter} x {ins.wait_per_step})")
            if ins.wait_per_step < 0:
                bad.append(f"{what}: negative wait_per_step {ins.wait_per_step}")
            if ins.wait_per_step > 0 and ins.wait_counter <= 0:
                bad.append(f"{what}: waits on counter {ins.wait_counter}, which is never raised "
                           f"(counter 0 is reserved)")
            if ins.signal_counter == 0 or ins.signal_counter < -1:
                bad.append(f"{what}: signals counter {ins.signal_counter} (use -1 for none; 0 is reserved)")
            for c in (ins.wait_counter if ins.wait_per_step > 0 else 0, ins.signal_counter):
                if num_counters is not None and c >= num_counters:
                    bad.append(f"{what}: counter {c} is out of range (the tape has {num_counters})")
    _fail("malformed instruction", bad)


# ---------------------------------------------------------------------------------------------
# 2. every tile exactly once


def _check_coverage(lists, stages):
    by_stage: dict[tuple, list] = defaultdict(list)
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.op not in (Op.NOOP, Op.BARRIER):
                by_stage[(Op(ins.op), ins.layer)].append((ins.tile_start, ins.tile_end, w, i))
    bad = []
    for s in stages:
        name = f"{s.op.name} layer {s.layer}"
        nxt, last = 0, None
        for a, b, w, i in sorted(by_stage.get((s.op, s.layer), [])):
            if a < nxt:
                bad.append(f"{where(lists, w, i)} repeats tiles {a}..{min(b, nxt) - 1} of {name}, already "
                           f"scheduled by {where(lists, *last)}")
            elif a > nxt:
                bad.append(f"{name}: tiles {nxt}..{a - 1} are scheduled nowhere (next is {where(lists, w, i)})")
            if b > nxt:
                nxt, last = b, (w, i)
        if nxt < s.ntiles:
            after = f" (last is {where(lists, *last)})" if last else ""
            bad.append(f"{name}: tiles {nxt}..{s.ntiles - 1} are scheduled nowhere{after}")
        elif nxt > s.segments[-1].tile_end:
            bad.append(f"{where(lists, *last)} schedules tiles {s.segments[-1].tile_end}..{nxt - 1} of {name}, "
                       f"which are its pool's (claimed at run time)")
    _fail("tiles not scheduled exactly once", bad)


def _check_pools(lists, plan: Plan, names, num_counters):
    by_stage: dict[tuple, list] = defaultdict(list)
    waited_or_signalled = set()
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.op not in (Op.NOOP, Op.BARRIER):
                by_stage[(Op(ins.op), ins.layer)].append((w, i, ins))
            waited_or_signalled |= {ins.wait_counter if ins.wait_per_step > 0 else 0, ins.signal_counter}
    bad, owner = [], {}
    for (op, layer), instrs in sorted(by_stage.items()):
        pool = plan.pool(op)
        want = pool + len(instrs) if pool else 0
        for w, i, ins in instrs:
            what = where(lists, w, i)
            if not pool and (ins.pool_counter or ins.pool_claims):
                bad.append(f"{what}: claims from {_counter(names, ins.pool_counter)}, but {op.name} has no pool")
            elif pool and ins.pool_claims != want:
                bad.append(f"{what}: counts {ins.pool_claims} claims a step, where its pool of {pool} tiles and "
                           f"the stage's {len(instrs)} instructions make {want}")
            elif pool and (ins.pool_counter <= 0 or ins.pool_counter in waited_or_signalled
                           or num_counters is not None and ins.pool_counter >= num_counters):
                bad.append(f"{what}: claims from {_counter(names, ins.pool_counter)}, which is not a counter of "
                           f"its own (reserved, out of range, or waited on or signalled)")
            elif pool and owner.setdefault(ins.pool_counter, (op, layer)) != (op, layer):
                bad.append(f"{what}: claims from {_counter(names, ins.pool_counter)}, which "
                           f"{owner[ins.pool_counter][0].name} layer {owner[ins.pool_counter][1]} claims from too")
        if pool and len({ins.pool_counter for _, _, ins in instrs}) > 1:
            bad.append(f"{op.name} layer {layer}: its instructions claim from different counters, so none "
                       f"sees the pool run out")
    _fail("bad pool", bad)


# ---------------------------------------------------------------------------------------------
# 3. counters


def _check_counters(lists, names) -> dict[int, list[tuple[int, int]]]:
    raisers: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.signal_counter > 0:
                raisers[ins.signal_counter].append((w, i))
    bad = []
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.wait_per_step <= 0:
                continue
            c, k = ins.wait_counter, ins.wait_per_step
            n = len(raisers.get(c, ()))
            if n == 0:
                bad.append(f"{where(lists, w, i)} waits on {_counter(names, c)}, which no instruction raises "
                           f"(a missing producer)")
            elif n < k:
                hint = " (every worker must reach each barrier once)" if ins.op == Op.BARRIER else ""
                bad.append(f"{where(lists, w, i)} waits for {k} signals a step on {_counter(names, c)}, which "
                           f"only {n} instruction{'s raise' if n > 1 else ' raises'}: the wait is never "
                           f"satisfied{hint}")
            elif n > k:
                bad.append(f"{where(lists, w, i)} waits for {k} signals a step on {_counter(names, c)}, which "
                           f"{n} instructions raise: counters only grow, so a later step's wait passes before "
                           f"its producers finish")
    _fail("bad wait", bad)
    return raisers


# ---------------------------------------------------------------------------------------------
# 4. deadlock: simulate the workers


def run_workers(lists, counters: dict, step: int = 0, execute=None):
    """Run every worker's list in order, round-robin, each advancing while its next instruction's
    wait ``counters[c] >= wait_per_step * (step + 1)`` holds; a BARRIER signals, then waits.
    ``execute(ins)`` (if given) runs each instruction. Stops when every worker is done or none can
    advance. Returns (position reached, barrier already signalled there, dependent steps) per
    worker: the dependent steps of an instruction are those of the latest producer it waited on,
    plus one."""
    W = len(lists)
    pos, signalled, level = [0] * W, [False] * W, [0] * W
    clevel: dict[int, int] = defaultdict(int)
    progress = True
    while progress:
        progress = False
        for w in range(W):
            lst, p = lists[w], pos[w]
            while p < len(lst):
                ins = lst[p]
                if ins.op == Op.BARRIER and not signalled[w]:
                    c = ins.signal_counter
                    counters[c] = counters.get(c, 0) + 1
                    clevel[c] = max(clevel[c], level[w])
                    signalled[w] = progress = True
                if ins.wait_per_step > 0:
                    c = ins.wait_counter
                    if counters.get(c, 0) < ins.wait_per_step * (step + 1):
                        break
                    level[w] = max(level[w], clevel[c] + 1)
                if execute is not None:
                    execute(ins)
                if ins.op != Op.BARRIER and ins.signal_counter > 0:
                    c = ins.signal_counter
                    counters[c] = counters.get(c, 0) + 1
                    clevel[c] = max(clevel[c], level[w])
                signalled[w] = False
                p += 1
                progress = True
            pos[w] = p
    return pos, signalled, level


def stuck_report(lists, pos, signalled, counters: dict, step: int = 0, names: dict | None = None) -> str:
    """Why workers stopped at ``pos``: the stuck instructions and, where the waits form one, the
    cycle (each waits for a counter raised only behind the next one)."""
    names = names or {}
    W = len(lists)
    stuck = [w for w in range(W) if pos[w] < len(lists[w])]
    pending: dict[int, list] = defaultdict(list)    # counter -> instructions not yet run that raise it
    for v in stuck:
        for j in range(pos[v], len(lists[v])):
            c = lists[v][j].signal_counter
            if c > 0 and not (j == pos[v] and signalled[v]):
                pending[c].append((v, j))

    def waiting(w):
        ins = lists[w][pos[w]]
        c, target = ins.wait_counter, ins.wait_per_step * (step + 1)
        return c, f"waits for {_counter(names, c)} to reach {target} (it is at {counters.get(c, 0)})"

    heads = ", ".join(where(lists, w, pos[w]) for w in stuck[:MAX_REPORTED])
    more = f" and {len(stuck) - MAX_REPORTED} more" if len(stuck) > MAX_REPORTED else ""
    msg = f"deadlock: no worker can advance; {len(stuck)} stuck at {heads}{more}"
    path, seen, w = [], {}, stuck[0]
    while w not in seen:
        seen[w] = len(path)
        c, text = waiting(w)
        if not pending.get(c):
            return msg + f". {where(lists, w, pos[w])} {text}, and nothing left raises it"
        v, j = pending[c][0]
        path.append(f"{where(lists, w, pos[w])} {text}, raised by {where(lists, v, j)}"
                    + (" later on the same worker" if v == w else f", which is behind it on worker {v}"))
        w = v
    cycle = path[seen[w]:]
    return msg + ". Cycle: " + "; ".join(cycle) + "."


def _check_deadlock(lists, names):
    counters: dict[int, int] = {}
    pos, signalled, _ = run_workers(lists, counters)
    if any(p < len(lst) for p, lst in zip(pos, lists)):
        raise TapeError(stuck_report(lists, pos, signalled, counters, 0, names))


def dependent_steps(tape, plan: Plan | None = None) -> int:
    """The critical path of one step: the longest chain of waits (each a cross-worker round trip)."""
    lists = tape.workers if _is_tape(tape) else tape
    counters: dict[int, int] = {}
    pos, signalled, level = run_workers(lists, counters)
    if any(p < len(lst) for p, lst in zip(pos, lists)):
        names = tape.counter_names if _is_tape(tape) else {}
        raise TapeError(stuck_report(lists, pos, signalled, counters, 0, names))
    return max(level)


# ---------------------------------------------------------------------------------------------
# 5. producers before consumers


def _merge(ranges):
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _covers(merged, a, b) -> bool:
    return any(x <= a and b <= y for x, y in merged)


def _epochs(lists, raisers):
    """Per instruction, how many global barriers (every worker signals once and waits for all)
    precede it on its worker. The deadlock check has ruled out barriers in different orders, so
    equal numbers on two workers mean the same barrier."""
    W = len(lists)
    glob = {c for c, rs in raisers.items()
            if len({w for w, _ in rs}) == len(rs) == W
            and all(lists[w][i].op == Op.BARRIER and lists[w][i].wait_per_step == W for w, i in rs)}
    epoch = []
    for lst in lists:
        e, ep = 0, []
        for ins in lst:
            ep.append(e)
            if ins.op == Op.BARRIER and ins.signal_counter in glob:
                e += 1
        epoch.append(ep)
    return epoch


def _check_dependencies(lists, stages, raisers, mode, names):
    # for each stage: (tile range, producer key it needs) of its segments; each key's tiles
    segs: dict[tuple, list] = {}
    produced: dict[tuple, list] = defaultdict(list)
    key_stage: dict[tuple, tuple] = {}
    for s in stages:
        rows = []
        for j, seg in enumerate(s.segments):
            dep = s.waits_on[j] if len(s.waits_on) == len(s.segments) else (s.waits_on[0] if s.waits_on else None)
            rows.append((seg.tile_start, seg.tile_end, seg.key, dep))
            produced[seg.key].append((seg.tile_start, seg.tile_end))
            key_stage[seg.key] = (s.op, s.layer)
        segs[(s.op, s.layer)] = rows

    def overlapping(ins, field):
        return {r[field] for r in segs[(Op(ins.op), ins.layer)]
                if r[field] is not None and r[0] < ins.tile_end and ins.tile_start < r[1]}

    covered: dict[int, dict] = {}

    def coverage(c):
        """(op, layer) -> merged tile ranges computed by the raisers of counter c."""
        if c not in covered:
            r = defaultdict(list)
            for w, i in raisers.get(c, ()):
                ins = lists[w][i]
                if ins.op not in (Op.NOOP, Op.BARRIER):
                    r[(Op(ins.op), ins.layer)].append((ins.tile_start, ins.tile_end))
            covered[c] = {k: _merge(v) for k, v in r.items()}
        return covered[c]

    epoch, makers = None, None
    if mode == "superkernel":
        epoch = _epochs(lists, raisers)
        makers = defaultdict(list)       # producer key -> (epoch, worker, position), latest first
        for w, lst in enumerate(lists):
            for i, ins in enumerate(lst):
                if ins.op not in (Op.NOOP, Op.BARRIER):
                    for key in overlapping(ins, 2):
                        makers[key].append((epoch[w][i], w, i))
        for v in makers.values():
            v.sort(reverse=True)

    satisfied: dict[tuple, bool] = {}

    def waits_for(c, dep):
        """Do the raisers of counter c compute every tile of producer key dep?"""
        if (c, dep) not in satisfied:
            merged = coverage(c).get(key_stage[dep], [])
            satisfied[(c, dep)] = all(_covers(merged, a, b) for a, b in produced[dep])
        return satisfied[(c, dep)]

    bad = []
    for w, lst in enumerate(lists):
        for i, ins in enumerate(lst):
            if ins.op in (Op.NOOP, Op.BARRIER):
                continue
            for dep in sorted(overlapping(ins, 3)):
                pop, pl = key_stage[dep]
                tiles = produced[dep]
                if ins.wait_per_step > 0 and waits_for(ins.wait_counter, dep):
                    continue
                dname = f"{pop.name} layer {pl}" + (f" kv group {dep[2]}" if pop in (Op.QKV, Op.ATTN) else "")
                dname += f" (tiles {', '.join(f'{a}..{b - 1}' for a, b in tiles)})"
                if mode == "megakernel":
                    got = f"waits on {_counter(names, ins.wait_counter)}, whose raisers do not compute them" \
                        if ins.wait_per_step > 0 else "waits on nothing"
                    bad.append(f"{where(lists, w, i)} needs {dname} but {got}: a missing producer")
                    continue
                for e, v, j in makers[dep]:
                    if e < epoch[w][i]:
                        break
                    if not (v == w and j < i):
                        bad.append(f"{where(lists, w, i)} needs {dname}, but {where(lists, v, j)} is not "
                                   f"before a barrier it waits behind")
                        break
    _fail("consumer not ordered after its producer", bad)
