"""Print the latency model: explosion to the next job's first training step, on AWS, part by part.

    python -m stabilizer.bench_latency

The figures and their sources are in stabilizer/latency.py (documented, measured, derived or
assumed; none measured on AWS). The last lines give each way's total and its ratio to the
original sample's.
"""

from __future__ import annotations

from stabilizer.latency import Way, ways


def table(all_ways: list[Way]) -> str:
    lines = []
    for way in all_ways:
        lines.append(way.name)
        for part in way.parts:
            figure = part.figure
            lines.append(f"  {part.name:<40} {figure.seconds:>7.1f} s  {figure.kind:<10} {figure.source}")
        lines.append(f"  {'total':<40} {way.seconds:>7.1f} s")
        lines.append("")
    base = all_ways[0].seconds
    lines.append(f"{'way':<62} {'total':>9} {'vs sample':>10}")
    for way in all_ways:
        lines.append(f"{way.name:<62} {way.seconds:>7.1f} s {base / way.seconds:>9.1f}x")
    return "\n".join(lines)


def main() -> None:
    print(table(ways()))


if __name__ == "__main__":
    main()
