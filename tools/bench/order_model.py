#!/usr/bin/env python3
"""A model of the tail that the order of the tiles leaves (note 07, "The order of the tiles").

Each tile costs the K/V blocks it visits (forward; the query blocks, backward), plus one for
its fixed costs; the tiles are handed, in order, to whichever SM (block slot) is free first —
list scheduling, as the hardware starts a grid's blocks and as a persistent grid's counter
hands out tiles. The model's finishing time ÷ the work divided evenly over the slots is the
tail: 1.00 is none. Three orders: head after head (a head's heaviest tile first);
heaviest first across a section of heads (steps/07_hopper/step07.hpp's tile_order: sections a
power of two of heads that divides B·H, whose bytes take at most two thirds of the H200's 60 MiB L2);
and head after head up to the last section, heaviest first across that one (tile_order's choice
where a head has at most SMs / 8 tiles).

    python3 tools/bench/order_model.py            # every causal shape of note 07's tables
"""
import heapq

L2 = 60 * 1024 * 1024  # the H200's, as cudaDevAttrL2CacheSize reports it (62914560 bytes)
SMS = 132


def finish(costs, slots):
    """List scheduling: each tile, in order, to the slot that frees first; the last slot's end."""
    free = [0.0] * slots
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def section(heads, bytes_a_head):
    """tile_order's section: the largest power of two dividing heads whose bytes fit 2/3 of the L2."""
    s = 1
    while heads % (2 * s) == 0 and 2 * s * bytes_a_head <= L2 * 2 / 3:
        s *= 2
    return s


def tails(cost, blocks, heads, bytes_a_head, slots):
    """(head after head, sectioned, last section only) tails for `heads` heads of `blocks` tiles, cost(p) the
    p-th heaviest's. The third: head after head up to the last section, heaviest first across that
    one."""
    head_major = [cost(p) + 1 for _ in range(heads) for p in range(blocks)]
    s = section(heads, bytes_a_head)
    sectioned = [cost(p) + 1 for _ in range(heads // s) for p in range(blocks) for _ in range(s)]
    last_only = head_major[:(heads - s) * blocks] + sectioned[(heads - s) * blocks:]
    even = sum(head_major) / slots
    return tuple(finish(order, slots) / even for order in (head_major, sectioned, last_only))


def tile_rows(direction, d, N):
    """Production's causal tile at d, N: forward, the rows of a query block (128; 192 at d = 64 on the persistent
    grid, past the short problems, which run h1's 128 rows two blocks an SM at N <= 2048); backward, the keys of a
    key block (128; 64 at d = 256)."""
    if direction == "forward":
        return 192 if d == 64 and N > 2048 else 128
    return 64 if d == 256 else 128


def last_section_only(blocks, sms=SMS):
    """tile_order's choice (step07.hpp): the last section only where a head's `blocks` tiles are at most an
    eighth of the SMs, every section elsewhere."""
    return 8 * blocks <= sms


def shapes():
    """(direction, d, B·H·N, N, heads, blocks, cost, bytes a head, slots): note 07's causal shapes, with the
    production kernel's tiles at each (forward: 128 rows, 192 at d = 64 on the persistent grid, h1's 128 rows and
    two blocks an SM at d = 64 and N ≤ 2048; 128 keys, 80 at d = 256; backward: 128 keys, 64 at d = 256, 96, 80,
    64 queries a step at d = 64, 128, 256)."""
    for tokens in (131072, 524288):
        for d in (64, 128, 256):
            for N in (1024, 2048, 4096, 8192, 16384, 32768):
                heads = tokens // N
                short = d == 64 and N <= 2048
                rows, keys = tile_rows("forward", d, N), (80 if d == 256 else 128)
                qb = -(-N // rows)
                fwd = lambda p, qb=qb, rows=rows, keys=keys, N=N: (min(N, (qb - p) * rows) - 1) // keys + 1
                yield "forward", d, tokens, N, heads, qb, fwd, 4 * N * d, 2 * SMS if short else SMS
                bkeys, q = tile_rows("backward", d, N), {64: 96, 128: 80, 256: 64}[d]
                kb, nq = -(-N // bkeys), -(-N // q)
                bwd = lambda j, nq=nq, bkeys=bkeys, q=q: nq - (j * bkeys) // q
                yield "backward", d, tokens, N, heads, kb, bwd, 8 * N * d, SMS


def main():
    print("direction d B·H·N N: head after head, sectioned, the last section only (finish ÷ the work divided evenly)")
    spans = {}
    for direction, d, tokens, N, heads, blocks, cost, nbytes, slots in shapes():
        hm, sec, last = tails(cost, blocks, heads, nbytes, slots)
        print(f"{direction:8} {d:3} {tokens:6} {N:5}: {hm:.3f} {sec:.3f} {last:.3f}")
        spans.setdefault(tokens, []).append((hm, sec, last))
    for tokens, v in sorted(spans.items()):
        span = lambda i: f"{min(x[i] for x in v):.2f}–{max(x[i] for x in v):.2f}"
        print(f"B·H·N = {tokens}: head after head {span(0)}, sectioned {span(1)}, the last section only {span(2)}")


if __name__ == "__main__":
    main()
