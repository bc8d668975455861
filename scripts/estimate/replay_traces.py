"""H3 (issue 16, round 2): replay each H200 allocator trace through the caching allocator's rules.

    python3 scripts/estimate/replay_traces.py

Reads testdata/h200/estimate/round2-traces.tar (one `torch.cuda.memory._record_memory_history`
trace per traced case: alloc `a`, free `F`, segment `S` events with address and size) and
truth-phases-round2.jsonl (the measured `max_memory_reserved`). For each case it feeds the
trace's own allocations and frees, in order, to a replay of CUDACachingAllocator's rules
(the rules of crates/vramctl-model/src/caching_allocator.rs) and prints the peak reserved
the replay reaches, with new segments at decreasing addresses (as the driver handed them
out: the trace's `S` addresses go down) and, for comparison, at increasing ones (which
block wins among free blocks of the same size depends on the address).

The rules: a request is rounded up to 512 B; up to 1 MiB it comes from the small pool
(2 MiB segments), above from the large pool (20 MiB segments below 10 MiB, else the request
rounded up to 2 MiB); best fit (smallest size, then lowest address); a block splits when the
rest is over 1 MiB (large) or at least 512 B (small); a freed block merges with its free
neighbours; segments are never released.
"""
import bisect
import gzip
import io
import json
import os
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "testdata/h200/estimate")
MIN_BLOCK = 512
SMALL_REQUEST = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_ROUND = 2 << 20


class Block:
    __slots__ = ("addr", "size", "small", "free", "prev", "next")

    def __init__(self, addr, size, small):
        self.addr, self.size, self.small = addr, size, small
        self.free = True
        self.prev = self.next = None


class Allocator:
    def __init__(self, descending):
        self.pools = {True: [], False: []}  # sorted (size, addr) of free blocks
        self.blocks = {}
        self.descending = descending
        self.next_addr = 1 << 50
        self.reserved = self.peak_reserved = 0
        self.allocated = self.peak_allocated = 0
        self.segments = 0

    def _insert(self, b):
        bisect.insort(self.pools[b.small], (b.size, b.addr))
        self.blocks[(b.size, b.addr)] = b

    def _remove(self, b):
        pool = self.pools[b.small]
        pool.pop(bisect.bisect_left(pool, (b.size, b.addr)))
        del self.blocks[(b.size, b.addr)]

    def malloc(self, n):
        size = max(MIN_BLOCK, -(-n // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_REQUEST
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            b = self.blocks[pool[i]]
            self._remove(b)
        else:
            if small:
                seg = SMALL_SEGMENT
            elif size < MIN_LARGE_ALLOC:
                seg = LARGE_SEGMENT
            else:
                seg = -(-size // LARGE_ROUND) * LARGE_ROUND
            if self.descending:
                self.next_addr -= seg + (1 << 30)
                b = Block(self.next_addr, seg, small)
            else:
                b = Block(self.next_addr, seg, small)
                self.next_addr += seg + (1 << 30)
            self.reserved += seg
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_REQUEST):
            r = Block(b.addr + size, rest, small)
            r.prev, r.next = b, b.next
            if b.next:
                b.next.prev = r
            b.next = r
            b.size = size
            self._insert(r)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def free(self, b):
        b.free = True
        self.allocated -= b.size
        for nb in (b.prev, b.next):
            if nb is not None and nb.free:
                self._remove(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next:
                        b.next.prev = nb
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next:
                        nb.next.prev = b
        self._insert(b)


def replay(events, descending):
    a = Allocator(descending)
    live = {}
    for code, addr, size, _t in events:
        if code == "a":
            live[addr] = a.malloc(size)
        elif code == "F":
            b = live.pop(addr, None)
            if b is not None:
                a.free(b)
    return a


def traces():
    with tarfile.open(os.path.join(DATA, "round2-traces.tar")) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".trace.json.gz"):
                case = os.path.basename(m.name)[: -len(".trace.json.gz")]
                raw = tar.extractfile(m).read()
                yield case, json.load(io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw))))


def main():
    measured = {}
    for line in open(os.path.join(DATA, "truth-phases-round2.jsonl")):
        r = json.loads(line)
        measured[r["case"]] = r["torch"]["peak_reserved_bytes"]
    gb = 1e9
    print(f"{'case':32} {'measured':>9} {'down':>9} {'err':>8} {'up':>9} {'err':>8} {'segments':>8}")
    exact = within = n = 0
    worst_up = 0.0
    for case, trace in sorted(traces()):
        m = measured[case]
        down = replay(trace["events"], True)
        up = replay(trace["events"], False)
        e_down = (down.peak_reserved - m) / m
        e_up = (up.peak_reserved - m) / m
        n += 1
        exact += down.peak_reserved == m
        within += abs(e_up) <= 0.01
        worst_up = max(worst_up, abs(e_up))
        print(f"{case:32} {m / gb:9.3f} {down.peak_reserved / gb:9.3f} {100 * e_down:+7.2f}% "
              f"{up.peak_reserved / gb:9.3f} {100 * e_up:+7.2f}% {down.segments:8}")
    print(f"{n} traces: decreasing addresses give the measured peak reserved to the byte on {exact}; "
          f"increasing ones within 1 % on {within} (worst {100 * worst_up:.2f} %)")


if __name__ == "__main__":
    main()
