"""bench/peers_bench.py's PNG plots (matplotlib, headless): TTFT, decode, ITL, P14 over time."""

from __future__ import annotations

from pathlib import Path

from bench.common import median
from bench.peers_report import (
    LCPP,
    LLAMAD,
    P14_CONFIGS,
    SERVER,
    TTFT_PATHS,
    Results,
    has_p14,
    p14_rates,
    window_rates,
)

COLORS = {LLAMAD: "tab:blue", SERVER: "tab:orange", LCPP: "tab:green"}
STYLES = {
    "cold": ":",
    "repeat": "-",
    "ram": "-.",
    "ram-cache": "-.",
    "restart": "--",
    "disk-restart": "--",
}


def plot_all(results: Results, out: Path, stem: str) -> list[Path]:
    """Write the plots beside the result file; their paths (none without matplotlib)."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, paths in TTFT_PATHS.items():
        # One colour per system; cold dotted, back to back solid, from a tier
        # or a host-RAM cache dash-dotted, after a restart dashed.
        for variant, what in paths:
            style = STYLES.get(variant, "-")
            xs = [n for n in results.sizes if results.get("ttft", system, variant, n)]
            if xs:
                ys = [median(results.get("ttft", system, variant, n)) for n in xs]
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    linestyle=style,
                    color=COLORS[system],
                    label=f"{system}: {what}",
                )
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, ms (median)")
    ax.set_xticks(list(results.sizes))
    ax.axhline(25, color="grey", linestyle=":", linewidth=1)
    ax.legend(fontsize=6)
    ax.set_title("TTFT by prompt length")
    fig.tight_layout()
    written.append(out / f"{stem}-ttft.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for system in (LLAMAD, SERVER, LCPP):
        xs = [s for s in (1, 4) if results.get("decode", system, s)]
        if xs:
            ax.plot(
                xs,
                [median(results.get("decode", system, s)) for s in xs],
                marker="o",
                color=COLORS[system],
                label=system,
            )
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate decode, tok/s (median)")
    ax.set_xticks([1, 4])
    ax.legend()
    ax.set_title("Decode throughput by stream count")
    fig.tight_layout()
    written.append(out / f"{stem}-decode.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    if any(results.itl_ms.values()):
        fig, ax = plt.subplots(figsize=(6, 4))
        data = [(k, v) for k, v in results.itl_ms.items() if v]
        ax.hist([v for _, v in data], bins=40, label=[k for k, _ in data], histtype="step")
        ax.set_yscale("log")
        ax.set_xlabel("inter-token latency, ms")
        ax.set_ylabel("intervals")
        ax.legend()
        ax.set_title("llamad ITL with saves firing vs saves off")
        fig.tight_layout()
        written.append(out / f"{stem}-itl.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    if has_p14(results) and contention_lines(results):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labelled: set[str] = set()
        for (system, config, rnd), (xs, ys) in contention_lines(results).items():
            label = f"{system}, {dict(P14_CONFIGS)[config].split(' (')[0]}"
            ax.step(
                xs,
                ys,
                where="post",
                color=COLORS[system],
                linestyle="-" if config == "default" else "--",
                alpha=1.0 if rnd == 0 else 0.5,
                label=None if label in labelled else label,
            )
            labelled.add(label)
        # Each system's quiet rate (median over rounds), for reference.
        for system in (LLAMAD, SERVER):
            for config, _ in P14_CONFIGS:
                quiet = p14_rates(results, system, config, "quiet")
                if quiet:
                    ax.axhline(
                        median(quiet),
                        color=COLORS[system],
                        linestyle="-" if config == "default" else "--",
                        linewidth=0.6,
                        alpha=0.4,
                    )
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds since the request was sent")
        ax.set_ylabel("decode, tok/s per 1 s window")
        ax.legend(fontsize=7)
        ax.set_title("Decode beside a CPU hog per core (P14); thin lines: quiet medians")
        fig.tight_layout()
        written.append(out / f"{stem}-contention.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def contention_lines(
    results: Results, width: float = 1.0
) -> dict[tuple[str, str, int], tuple[list[float], list[float]]]:
    """P14's lines beside the hogs: per (system, config, round) the windows'
    start times (and the stream's end) and tokens per second in each
    (:func:`window_rates` up to that stream's end)."""
    lines: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
    for k, times in results.timeline.items():
        system, config, phase, rnd = k.split("/")
        if phase != "hogs":
            continue
        spans = results.get("p14", system, config, phase, "span_s")
        i = int(rnd)
        end = spans[i] if i < len(spans) else (max(times) if times else 0.0)
        rates = window_rates(times, end, width)
        if rates:
            # Window starts, and the end with the last window's rate, so a
            # step plot ("post") draws every window to the stream's end.
            xs = [j * width for j in range(len(rates))] + [end]
            lines[(system, config, i)] = (xs, [*rates, rates[-1]])
    return lines
