#!/usr/bin/env python3
"""Issue 29 item 7's attack on `vramctl serve`, bounded, against loopback only.

    python3 scripts/serve-attack.py HOST:PORT [--slow 300] [--never-read 260]
        [--seconds 30] [--scrape-every 0.05] [--out DIR]

Three kinds of clients, for --seconds, then it stops by itself:
  - slow (slowloris): connect, send a request head one header line at a time, one line
    every --trickle seconds, never finishing it; reconnect when the server closes it;
  - never-read: connect with a 4 KiB receive buffer, send 64 pipelined GET /metrics and
    never read a byte; every second send one more, and reconnect when the server has closed
    the connection (the write fails);
  - the real scraper (a separate process, so the attackers' event loop cannot delay its
    clock): one GET /metrics at a time, a fresh connection each, every --scrape-every
    seconds; a scrape succeeds when it gets a complete 200 with the exposition's last line
    within --scrape-timeout.
Prints the scrapes' count, failures and p50/p90/p99/max latency; with --out, writes the
latencies (one per line, ms; failures as "fail REASON") and the summary there.

Only loopback addresses are accepted (127.0.0.0/8, ::1): this is a load test of a local
daemon, not a tool for other hosts. Mind the open-file limit: the soft limit is raised to
the hard one; the attack needs --slow + --never-read + a few descriptors.
"""

import argparse
import asyncio
import ipaddress
import multiprocessing
import os
import resource
import socket
import sys
import time


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("addr", help="HOST:PORT of the exporter (loopback only)")
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument("--never-read", type=int, default=260)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--trickle", type=float, default=1.0,
                        help="seconds between a slow client's header lines")
    parser.add_argument("--scrape-every", type=float, default=0.05)
    parser.add_argument("--scrape-timeout", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds the attack runs before the first scrape")
    parser.add_argument("--out", help="directory for latencies.txt and summary.txt")
    args = parser.parse_args()
    host, _, port = args.addr.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        parser.error(f"'{host}' is not an IP address; give a loopback address such as 127.0.0.1")
    if not ip.is_loopback:
        parser.error(f"'{host}' is not a loopback address; this load test targets only this host")
    if not (0 <= args.slow <= 5000 and 0 <= args.never_read <= 5000):
        parser.error("--slow and --never-read are bounded at 5000 each")
    if not 0 < args.seconds <= 600:
        parser.error("--seconds must be in (0, 600]")
    args.target = (str(ip), int(port))
    args.family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return args


def raise_nofile(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft < needed:
        sys.exit(f"the open-file limit ({soft}) is below the {needed} descriptors the attack needs")


REQUEST = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"


async def slow_client(args, deadline, stats):
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        sock = socket.socket(args.family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, args.target)
            stats["slow_connects"] += 1
            await loop.sock_sendall(sock, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
            n = 0
            while loop.time() < deadline:
                await asyncio.sleep(args.trickle)
                await loop.sock_sendall(sock, b"X-Slow-%d: x\r\n" % n)
                n += 1
        except OSError:
            stats["slow_dropped"] += 1
            await asyncio.sleep(0.01)
        finally:
            sock.close()


async def never_reader(args, deadline, stats):
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        sock = socket.socket(args.family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, args.target)
            stats["never_read_connects"] += 1
            try:
                sock.send(REQUEST * 64)
            except BlockingIOError:
                pass
            while loop.time() < deadline:
                await asyncio.sleep(1.0)
                try:
                    sock.send(REQUEST)
                except BlockingIOError:
                    pass  # the server stopped reading: it is blocked on us, as intended
        except OSError:
            stats["never_read_dropped"] += 1
            await asyncio.sleep(0.01)
        finally:
            sock.close()


async def attack(args, ready):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.seconds
    stats = {k: 0 for k in ("slow_connects", "slow_dropped", "never_read_connects",
                            "never_read_dropped")}
    tasks = [asyncio.create_task(slow_client(args, deadline, stats)) for _ in range(args.slow)]
    tasks += [asyncio.create_task(never_reader(args, deadline, stats))
              for _ in range(args.never_read)]
    ready.set()
    await asyncio.gather(*tasks)
    return stats


def attacker_main(args, ready, result):
    result.update(asyncio.run(attack(args, ready)))


def scrape_once(args):
    started = time.perf_counter()
    with socket.socket(args.family, socket.SOCK_STREAM) as sock:
        sock.settimeout(args.scrape_timeout)
        sock.connect(args.target)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if time.perf_counter() - started > args.scrape_timeout:
                raise TimeoutError("slow response")
    elapsed_ms = (time.perf_counter() - started) * 1000
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ValueError("status " + head[:20].decode(errors="replace"))
    if b"vramctl_last_sample_age_seconds " not in body:
        raise ValueError("truncated body")
    return elapsed_ms


def main():
    args = parse_args()
    raise_nofile(args.slow + args.never_read + 64)
    ready = multiprocessing.Event()
    manager = multiprocessing.Manager()
    result = manager.dict()
    attacker = multiprocessing.Process(target=attacker_main, args=(args, ready, result))
    attacker.start()
    ready.wait(30)
    time.sleep(args.warmup)
    latencies, failures = [], []
    end = time.monotonic() + max(args.seconds - args.warmup - 1, 1)
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            latencies.append(scrape_once(args))
        except (OSError, ValueError) as err:
            failures.append(type(err).__name__ + ": " + str(err))
        time.sleep(max(0.0, args.scrape_every - (time.monotonic() - started)))
    attacker.join(args.seconds + 30)
    if attacker.is_alive():
        attacker.terminate()
    total = len(latencies) + len(failures)
    lines = [
        f"attack: {args.slow} slow, {args.never_read} never-read clients for {args.seconds:g} s "
        f"against {args.target[0]}:{args.target[1]}; attackers: {dict(result)}",
        f"scrapes: {total}, failed: {len(failures)} ({100 * len(failures) / max(total, 1):.1f} %)",
    ]
    if total:
        # Nearest rank over every scrape, a failed one counting as the slowest: a scrape
        # that did not answer is not left out of the p99.
        ranked = sorted(latencies) + [float("inf")] * len(failures)
        def pct(p):
            return ranked[max(0, -(-p * total // 100) - 1)]
        fmt = lambda ms: "failed" if ms == float("inf") else f"{ms:.2f} ms"
        lines.append(f"latency (nearest rank, failures as slowest): p50 {fmt(pct(50))}, "
                     f"p90 {fmt(pct(90))}, p99 {fmt(pct(99))}, max {fmt(ranked[-1])}")
    if failures:
        kinds = {}
        for f in failures:
            kinds[f.split(":")[0]] = kinds.get(f.split(":")[0], 0) + 1
        lines.append(f"failures by kind: {kinds}")
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "latencies.txt"), "w") as f:
            f.writelines(f"{ms:.3f}\n" for ms in latencies)
            f.writelines(f"fail {reason}\n" for reason in failures)
        with open(os.path.join(args.out, "summary.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
