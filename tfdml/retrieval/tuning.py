"""Tuning an approximate `ScannIndex` to a recall target (`ScannIndex.tune`, the `tfdml.retrieval.index` module
docstring): recall@k measured against exact search on sampled queries, the fewest leaves (and re-ordered
candidates) whose lower confidence bound reaches the target, else brute force; and the record it leaves."""

import math
import time

import numpy as np

from tfdml.ops.neighbours import validate_distance

RECALL_QUERIES = 500
# The target must hold at this one-sided confidence: the recall measured on RECALL_QUERIES sampled queries has a
# standard error (~0.005 at recall 0.95), and settings tuned to the sample's mean alone meet the target on other
# queries only about half the time (0.949 on 1M items' test queries for a target of 0.95).
RECALL_CONFIDENCE = 0.95
# Re-ordered candidates tried at each number of leaves: multiples of max(reorder, reorder_factor * k).
REORDER_STEPS = (1, 2, 4)


class Probe:
    """Searches of `queries` with an index's settings changed: recall@k against the exact neighbours (its lower
    confidence bound, `z` standard errors below the mean) and time; `stats` keeps each setting's mean and
    standard error."""

    def __init__(self, index, queries, rows, exact, k, z):
        self.index, self.queries, self.rows, self.exact, self.k, self.z = index, queries, rows, exact, k, z
        self.stats = {}  # (leaves, reorder) -> (mean recall, standard error of the mean)

    def measure(self, leaves, reorder):
        """`(lower confidence bound of recall@k, seconds)` of the queries searched with these settings."""
        index, k, rows = self.index, self.k, self.rows
        index.settings.update(leaves_to_search=leaves, reorder=reorder)
        found, seconds = timed(lambda: index._search(self.queries, k + (rows is not None))[0])
        found = drop_rows(np.asarray(found, np.int64), rows, k)
        per_query = np.array([len(set(a) & set(b)) for a, b in zip(found, self.exact)], np.float64) / k
        mean = float(per_query.mean())
        error = float(per_query.std(ddof=1) / math.sqrt(len(per_query))) if len(per_query) > 1 else 0.0
        self.stats[leaves, reorder] = mean, error
        return mean - self.z * error, seconds

    def single_seconds(self, settings, rounds=3, count=200):
        """Seconds a single query takes with each `(leaves, reorder)` of `settings` (`count` of the queries, one
        call each; the least of `rounds` rounds, the settings interleaved so they share the load)."""
        best = [math.inf] * len(settings)
        for _ in range(rounds):
            for i, (leaves, reorder) in enumerate(settings):
                self.index.settings.update(leaves_to_search=leaves, reorder=reorder)
                start = time.perf_counter()
                for query in self.queries[:count]:
                    self.index._search(query, self.k)
                best[i] = min(best[i], (time.perf_counter() - start) / min(count, len(self.queries)))
        return best


def recall_record(index, probe, target_recall, confidence, search_settings, source, exact_seconds):
    """Chooses the settings (the fewest leaves reaching the target, or those given) and returns the recall record
    before any fall-back: `(record, leaves, seconds)`."""
    candidates = None
    if search_settings:
        leaves, reorder, bound, seconds, candidates = search_settings_for(
            index, probe.measure, target_recall, probe.k, probe.single_seconds
        )
    else:
        leaves, reorder = index.settings["leaves_to_search"], index.settings["reorder"]
        bound, seconds = probe.measure(leaves, reorder)
    recall, error = probe.stats[leaves, reorder]
    index.settings.update(leaves_to_search=int(leaves), reorder=int(reorder))
    queries = len(probe.queries)
    record = {
        "target": float(target_recall),
        "k": probe.k,
        "measured": recall,
        "standard_error": error,
        "lower_bound": bound,
        "confidence": float(confidence),
        "queries": int(queries),
        "query_source": source,
        "tuned": bool(search_settings),
        "leaves_to_search": int(leaves),
        "num_leaves": int(index.settings["num_leaves"]),
        "reorder": int(reorder),
        "ms_per_query": 1e3 * seconds / queries,
        "exact_ms_per_query": 1e3 * exact_seconds / queries,
        "fallback": None,
    }
    if candidates:  # the fewest leaves for each re-ordering step, and the single-query time of each
        record["candidates"] = candidates
    return record, leaves, seconds


def fallback_reason(record, leaves, seconds, exact_seconds, search_settings):
    """Why brute force serves the target better (it is not met, or not cheaper than exact search), or None."""
    k, target, num_leaves = record["k"], record["target"], record["num_leaves"]
    if record["lower_bound"] < target:
        return (
            f"recall@{k} {record['measured']:.3f} (lower {100 * record['confidence']:g}% bound "
            f"{record['lower_bound']:.3f}) < target {target:g} with {leaves} of {num_leaves} leaves searched"
        )
    if search_settings and seconds >= exact_seconds:
        return (
            f"recall@{k} {target:g} needs {leaves} of {num_leaves} leaves, {record['ms_per_query']:.3g} ms per "
            f"query against {record['exact_ms_per_query']:.3g} ms for exact search"
        )
    return None


def search_settings_for(index, measure, target, k, single_seconds):
    """`(leaves, reorder, recall, seconds, candidates)` (`recall`: what `measure` returns, the lower confidence
    bound): for each re-ordering step, the fewest leaves that reach `target` with it (doubling from the
    automatic start, then bisecting to within a sixteenth; a smaller step only up to twice the leaves the
    largest one needs), and of these settings the one whose single queries take the least time
    (`single_seconds`); the largest settings tried when none reaches `target`. Timing the settings, rather than
    taking the fewest leaves, matters because re-ordering a candidate costs about as much as scanning a few
    hundred hashed points (the search benchmark)."""
    num_leaves = index.settings["num_leaves"]
    base = int(max(index.settings["reorder"], math.ceil(index.settings.get("reorder_factor", 2) * k)))
    steps = [base * m for m in REORDER_STEPS]
    tried = {}

    def reaches(leaves, reorder):
        if (leaves, reorder) not in tried:
            tried[leaves, reorder] = measure(leaves, reorder)
        return tried[leaves, reorder][0] >= target

    def fewest(reorder, low, high, most):
        """The fewest leaves (between `low`, taken as not reaching, and `most`) reaching `target`; None."""
        while not reaches(high, reorder) and high < most:
            low, high = high, min(most, 2 * high)
        if not reaches(high, reorder):
            return None
        while high - low > max(1, high // 16):  # within ~6% of the fewest leaves
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(middle, reorder) else (middle, high)
        return high

    start = max(1, min(num_leaves, index.settings["leaves_to_search"]))
    least = fewest(steps[-1], 0, start, num_leaves)
    if least is None:
        most = max(leaves for leaves, _ in tried)
        return most, steps[-1], *tried[most, steps[-1]], []
    found = [(least, steps[-1])]
    for reorder in steps[:-1]:
        leaves = fewest(reorder, least - 1, least, min(num_leaves, 2 * least))
        if leaves is not None:
            found.append((leaves, reorder))
    # A setting that searches no fewer leaves and re-orders more candidates than another is never faster.
    found = [a for a in found if not any(b != a and b[0] <= a[0] and b[1] <= a[1] for b in found)]
    candidates = [
        {"leaves_to_search": leaves, "reorder": reorder, "lower_bound": tried[leaves, reorder][0]}
        for leaves, reorder in found
    ]
    if len(found) > 1:
        times = single_seconds(found)
        for candidate, seconds in zip(candidates, times):
            candidate["ms_per_single_query"] = 1e3 * seconds
        leaves, reorder = found[int(np.argmin(times))]
    else:
        leaves, reorder = found[0]
    return leaves, reorder, *tried[leaves, reorder], candidates


def describe_recall(record):
    """An index's recall record (`ScannIndex.recall`) in one line, as `tfdml export` prints it."""
    if record.get("fell_back"):
        return f"brute force: {record['fallback']}"
    text = (
        f"approximate, recall@{record['k']} {record['measured']:.3f}{_bound(record)} against exact search (target "
        f"{record['target']:g}, {record['queries']} {record['query_source']}), {record['leaves_to_search']} of "
        f"{record['num_leaves']} leaves searched, {record['reorder']} candidates re-ordered, "
        f"{record['ms_per_query']:.3g} ms per query in batches (exact search: {record['exact_ms_per_query']:.3g} ms)"
    )
    return text + (f"; {record['fallback']}" if record.get("fallback") else "")


def _bound(record):
    """`" (lower 95% bound 0.951)"` for a record with a confidence bound (records saved before it have none)."""
    if record.get("lower_bound") is None:
        return ""
    return f" (lower {100 * record['confidence']:g}% bound {record['lower_bound']:.3f})"


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def exact_neighbours(queries, embeddings, k, distance, rows=None):
    """Exact top-`k` gallery positions of each query (blocks of 64 queries: `64 x N` scores at a time); with
    `rows`, query `i` is gallery row `rows[i]`, which is left out of its own list."""
    extra = 0 if rows is None else 1
    squared_euclidean = validate_distance(distance) == "squared_euclidean"
    norms = np.einsum("ij,ij->i", embeddings, embeddings) if squared_euclidean else None
    out = np.empty((len(queries), k), np.int64)
    for start in range(0, len(queries), 64):
        scores = queries[start : start + 64] @ embeddings.T
        if norms is not None:  # nearest in L2 = largest 2 q.g - |g|^2
            scores = 2.0 * scores - norms[None, :]
        top = np.argpartition(-scores, k + extra - 1, axis=1)[:, : k + extra]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
        found = np.take_along_axis(top, order, 1)
        out[start : start + len(found)] = drop_rows(found, None if rows is None else rows[start : start + 64], k)
    return out


def drop_rows(found, rows, k):
    """The first `k` of each row of `found` without `rows[i]` (a query's own gallery row), if any."""
    if rows is None:
        return found[:, :k]
    kept = found != np.asarray(rows)[:, None]
    return np.array([row[mask][:k] for row, mask in zip(found, kept)])
