"""What `tilefold generate` and `bench llm` print and write: each contender's figures (prompt
and decode tok/s, first token cold and warm, peak RSS, bytes per token, % of the read
bandwidth), the ratios between contenders, and the perplexity table."""

from __future__ import annotations

from typing import Any

from tilefold.cli import llm_metrics
from tilefold.cli.llm_runs import Accuracy, Result, Workload
from tilefold.runtime.timing import SLOWED_BY, Timing

MB = 1e6
RSS_SLACK = 1.1, 100 * MB  # the bar: peak RSS <= 1.1 x (weights + KV cache) + 100 MB


def _rates(tokens: int, seconds: Timing) -> tuple[float, float]:
    return tokens / seconds.interleaved, tokens / seconds.alone


def figures(result: Result, work: Workload, gbps: float) -> dict[str, Any]:
    """One contender's figures as JSON (rates in tokens/s, times in s, sizes in bytes)."""
    job = result.job
    out: dict[str, Any] = {"label": job.label, "contender": job.key, "precision": job.quant,
                           "error": result.error}
    if result.warm is not None:
        sizes = result.warm["sizes"]
        per_token = sizes["weights_per_token"] + sizes["kv_per_token"]
        out.update(sizes, bytes_per_token=per_token,
                   rss_bound=RSS_SLACK[0] * (sizes["weights_stored"] + sizes["kv_cache"])
                   + RSS_SLACK[1], load_s=result.warm["load_s"],
                   ttft_warm_s=result.warm["ttft_s"], rss_base=result.warm["rss_base"],
                   info=result.warm["info"])
    if result.cold is not None:
        out.update(ttft_cold_s=result.cold["ttft_s"], cold_process_s=result.cold_s)
    if result.final is not None:
        out.update(peak_rss=result.final["peak_rss"], rss=result.final["rss"])
    if result.interleaved and result.alone and result.error is None:
        prefill, decode = result.timing("prefill_s"), result.timing("decode_s")
        out["prompt_tok_s"], out["prompt_tok_s_alone"] = _rates(len(work.prompt), prefill)
        out["decode_tok_s"], out["decode_tok_s_alone"] = _rates(work.new_tokens - 1, decode)
        out["slowed"] = prefill.slowed() or decode.slowed()
        out["bandwidth_share"] = llm_metrics.bandwidth_share(out["decode_tok_s"],
                                                             out["bytes_per_token"], gbps)
        if result.probed_gbps:
            out["probed_gbps"] = result.probed_gbps
            out["bandwidth_share_probed"] = llm_metrics.bandwidth_share(
                out["decode_tok_s"], out["bytes_per_token"], result.probed_gbps)
    out["tokens"] = result.tokens
    return out


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens two generations share from the first."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _cell(value: float | None, alone: float | None = None, digits: int = 1, width: int = 14,
          mark: str = "") -> str:
    if value is None:
        return f"{'-':>{width}}"
    text = f"{value:.{digits}f}" + ("" if alone is None else f"/{alone:.{digits}f}")
    return f"{text + mark:>{width}}"


def table(rows: list[dict[str, Any]], new_tokens: int) -> list[str]:
    """The contenders' table; `match` counts the tokens equal to the first row's."""
    first = rows[0]["tokens"] if rows else []
    lines = [f"{'contender':<22}{'prompt tok/s':>15}{'decode tok/s':>16}{'1st token s':>13}"
             f"{'load s':>8}{'RSS MB':>11}{'MB/token':>10}{'%BW':>10}{'match':>10}",
             f"{'':<22}{'interl/alone':>15}{'interl/alone':>16}{'cold/warm':>13}{'':>8}"
             f"{'end/peak':>11}{'':>10}{'rec/probe':>10}"]
    for row in rows:
        name = f"{row['label']:<22}"
        if "decode_tok_s" not in row:
            lines.append(f"{name}failed: {row['error'] or 'no timed run'}")
            continue
        mark = "!" if row["slowed"] else ""
        lines.append(
            name + _cell(row["prompt_tok_s"], row["prompt_tok_s_alone"], 0, 15, mark)
            + _cell(row["decode_tok_s"], row["decode_tok_s_alone"], 1, 16, mark)
            + _cell(row.get("ttft_cold_s"), row.get("ttft_warm_s"), 1, 13)
            + _cell(row.get("load_s"), None, 1, 8)
            + (_cell(row["rss"] / MB, row["peak_rss"] / MB, 0, 11) if "peak_rss" in row
               else _cell(None, width=11))
            + _cell(row["bytes_per_token"] / MB, None, 1, 10)
            + f"{_shares(row):>10}"
            + f"{same_prefix(first, row['tokens']):>6}/{len(row['tokens'])}")
    return lines


def _shares(row: dict[str, Any]) -> str:
    probed = row.get("bandwidth_share_probed")
    return f"{100 * row['bandwidth_share']:.0f}%" + ("" if probed is None else
                                                      f"/{100 * probed:.0f}%")


def notes(work: Workload, gbps: float, probed: float | None = None) -> list[str]:
    context = llm_metrics.mean_decode_context(len(work.prompt), work.new_tokens)
    return [
        "interl/alone: medians of the timed generations run in turn with the other contenders "
        f"/ on their own ('!': more than {SLOWED_BY:.0%} slower in turn: not evidence)",
        "1st token: seconds from the model in memory to the first new token (compile + "
        "prefill) in a new process: cold with empty tilefold and inductor caches, warm with the "
        "caches the cold one filled; load s: the model into memory (warm process)",
        "RSS: the warm process's after its timed runs / at its peak; MB/token: weights at their "
        f"stored precision + K and V at the mean decode context ({context:g} positions); "
        "%BW: decode tok/s x MB/token / the host's read bandwidth: its record (the best "
        f"`tilefold bench memory` probe ever, {gbps:.1f} GB/s at {work.threads} thread(s)) / "
        "the median of probes over a 1 GiB+ stream taken in turn with the timed runs"
        + ("" if probed is None else f" ({probed:.1f} GB/s)"),
        "match: tokens equal to the first row's, from the first",
    ]


def ratio(rows: dict[str, dict[str, Any]], us: str, peer: str, key: str) -> float | None:
    """How many times `us`'s `key` rate is `peer`'s (interleaved medians), if both ran."""
    a, b = rows.get(us, {}).get(key), rows.get(peer, {}).get(key)
    return a / b if a and b else None


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each tilefold row's decode and prompt speed over every peer's."""
    by = {r["label"]: r for r in rows}
    peers = [r["label"] for r in rows if r["contender"] != "tilefold" and "decode_tok_s" in r]
    lines = []
    for row in rows:
        if row["contender"] != "tilefold" or "decode_tok_s" not in row or not peers:
            continue
        for key, what in (("decode_tok_s", "decode"), ("prompt_tok_s", "prompt")):
            cells = [f"{ratio(by, row['label'], p, key):.2f}x {p}" for p in peers]
            lines.append(f"{row['label']} {what}: " + ", ".join(cells))
    return lines


# ---- perplexity --------------------------------------------------------------------------------

def accuracy_json(found: list[Accuracy]) -> list[dict[str, Any]]:
    return [{"label": a.job.label, "contender": a.job.key, "precision": a.job.quant,
             "perplexity": a.perplexity, "seconds": a.seconds, "error": a.error,
             **({} if a.agreement is None else {"kl_mean": a.agreement.kl_mean,
                                                "kl_max": a.agreement.kl_max,
                                                "top1_same": a.agreement.top1})}
            for a in found]


def accuracy_table(found: list[Accuracy]) -> list[str]:
    lines = [f"{'contender':<30}{'perplexity':>11}{'KL mean':>10}{'KL max':>9}{'top-1 same':>12}"]
    for i, a in enumerate(found):
        name = f"{a.job.label + (' (reference)' if i == 0 else ''):<30}"
        if a.perplexity is None:
            lines.append(f"{name}failed: {a.error}")
            continue
        line = name + f"{a.perplexity:>11.3f}"
        if a.agreement is not None:
            line += (f"{a.agreement.kl_mean:>10.5f}{a.agreement.kl_max:>9.4f}"
                     f"{100 * a.agreement.top1:>11.1f}%")
        lines.append(line)
    return lines
