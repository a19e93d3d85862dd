"""The deterministic end-state check of TOOLS.md §7: the final database against the task's `required_orders`.

An offline deterministic substitute for the official LLM judge (§6, which reads the transcript against
rubrics and never the database); its numbers are not comparable with published VitaBench numbers. It checks
the outcome only: a pass is necessary, not sufficient, for an official pass (delivery windows, "tell the
user X", dine-in stores and the like are invisible to it).

Records are compared by content, never by id or timestamp (gold ids and times are invented):
- order: store id, the multiset of (product id, quantity), status class;
- booking: shop id, book time, customer count, status class; reservation: shop id, reservation time,
  customer count, status class.
Status classes are `cancelled` and active (the tools cannot produce `processed`, `in-progress`,
`delivered`, nor a `paid` reservation); the strict variant also separates `unpaid` (a subscore only).

Matching order: (1) required records that existed at the start, by id and status class; (2) new required
records against records the episode created; (3) in-store, a gold order with several products against
several one-product orders of that shop; (4) pre-existing required records whose id no longer fits, against
created records by content; (5) swapped ids: anything still unmatched against a pre-existing record whose
status class the episode changed. Pass: every required record matched, every created record matched or
cancelled, every other pre-existing record still in its status class.

`value` is the share of these checks met: matched required records / (required records + stray active
records + wrongly changed pre-existing records), so it is 1.0 exactly when the task passes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from envace.envs.vitabench.db import Database, Order
from envace.types import Score

CAVEAT = "offline deterministic substitute for the official LLM judge; not comparable with published numbers"
ID_KEYS = {"order": "order_id", "booking": "book_id", "reservation": "reservation_id"}


@dataclass(frozen=True)
class View:
    """One order, booking or reservation reduced to what §7 compares."""

    kind: str
    id: str
    venue: str
    key: tuple[Any, ...]  # the content compared, status aside
    status: str
    items: tuple[tuple[str, Any], ...] = ()  # orders: sorted (product id, quantity)
    instore: bool = False

    def __str__(self) -> str:
        what = f"{list(self.items)}" if self.kind == "order" else f"{self.key[1]} x{self.key[2]}"
        return f"{self.kind} at {self.venue} {what} ({self.status})"


def kind_of(record: dict[str, Any]) -> str:
    """order_id → order, book_time → booking, reservation_time → reservation, else the id key. The time keys
    decide before the id keys because three gold records carry the other table's id key."""
    if "order_id" in record:
        return "order"
    if "book_time" in record:
        return "booking"
    if "reservation_time" in record:
        return "reservation"
    return "booking" if "book_id" in record else "reservation"


def _time(value: Any) -> str:
    text = str(value or "").strip()
    return text + ":00" if len(text) == 16 else text


def _product(p: Any) -> tuple[str, Any]:
    if isinstance(p, dict):
        return str(p.get("product_id", "")).strip(), p.get("quantity")
    return p.product_id, p.quantity


def gold_view(record: dict[str, Any]) -> View:
    """A required record, normalized: ids stripped, HH:MM times completed, nested orders in `products` ignored."""
    kind = kind_of(record)
    record_id = next((str(record[k]).strip() for k in ("order_id", "book_id", "reservation_id") if k in record), "")
    if kind == "order":
        items = tuple(sorted(_product(p) for p in record.get("products") or []
                             if not (isinstance(p, dict) and "order_id" in p)))
        venue = str(record.get("store_id", "")).strip()
        return View(kind, record_id, venue, (venue, items), record.get("status", ""), items,
                    record.get("order_type") == "instore")
    venue = str(record.get("shop_id", "")).strip()
    when = _time(record.get("book_time" if kind == "booking" else "reservation_time"))
    return View(kind, record_id, venue, (venue, when, record.get("customer_count")), record.get("status", ""))


def order_view(order: Order) -> View:
    items = tuple(sorted(_product(p) for p in order.products))
    return View("order", order.order_id, order.store_id, (order.store_id, items), order.status, items,
                order.order_type == "instore")


def db_views(db: Database) -> dict[tuple[str, str], View]:
    """Every record of a database, keyed by (kind, id)."""
    views = [order_view(o) for o in db.orders.values()]
    views += [View("booking", b.book_id, b.shop_id, (b.shop_id, b.book_time, b.customer_count), b.status)
              for b in db.books.values()]
    views += [View("reservation", r.reservation_id, r.shop_id, (r.shop_id, r.reservation_time, r.customer_count),
                   r.status) for r in db.reservations.values()]
    return {(v.kind, v.id): v for v in views}


def status_class(status: str, strict: bool = False) -> str:
    if status == "cancelled" or (strict and status == "unpaid"):
        return status
    return "active"


@dataclass
class Verdict:
    matched: list[bool]
    missing: list[View]
    strays: list[View]
    changed: list[View]

    @property
    def passed(self) -> bool:
        return all(self.matched) and not self.strays and not self.changed


def _split_match(gold: View, pool: list[View], klass: Any) -> list[View] | None:
    """Several one-product in-store orders of the gold's shop that together hold its products, or None."""
    need = Counter(gold.items)
    fits = [v for v in pool if v.kind == "order" and v.venue == gold.venue and klass(v.status) == klass(gold.status)
            and not Counter(v.items) - need]

    def search(rest: Counter, start: int) -> list[View] | None:
        if not +rest:
            return []
        for i in range(start, len(fits)):
            have = Counter(fits[i].items)
            if not have - rest:
                found = search(rest - have, i + 1)
                if found is not None:
                    return [fits[i], *found]
        return None

    return search(need, 0)


def compare(initial: Database, final: Database, required: list[dict[str, Any]], strict: bool = False) -> Verdict:
    """Match the required records against the final state (rules in the module docstring)."""
    def klass(status: str) -> str:
        return status_class(status, strict)

    before, after = db_views(initial), db_views(final)
    golds = [gold_view(r) for r in required]
    matched = [False] * len(golds)
    created = [v for k, v in after.items() if k not in before]
    used: set[tuple[str, str]] = set()  # (kind, id) of final records a gold took

    def take(i: int, views: list[View]) -> None:
        matched[i] = True
        used.update((v.kind, v.id) for v in views)

    def free(pool: list[View]) -> list[View]:
        return [v for v in pool if (v.kind, v.id) not in used]

    def by_content(i: int, pool: list[View], split: bool) -> bool:
        gold = golds[i]
        for v in free(pool):
            if v.kind == gold.kind and v.key == gold.key and klass(v.status) == klass(gold.status):
                take(i, [v])
                return True
        if split and gold.kind == "order" and gold.instore and len(gold.items) > 1:
            parts = _split_match(gold, free(pool), klass)
            if parts:
                take(i, parts)
                return True
        return False

    existed = [(gold.kind, gold.id) in before for gold in golds]
    for i, gold in enumerate(golds):  # (1) by id
        now = after.get((gold.kind, gold.id))
        if existed[i] and now is not None and klass(now.status) == klass(gold.status):
            take(i, [now])
    for split in (False, True):  # (2) new records by content, (3) split in-store orders
        for i in range(len(golds)):
            if not existed[i] and not matched[i]:
                by_content(i, created, split)
    for i in range(len(golds)):  # (4) pre-existing records by content
        if existed[i] and not matched[i]:
            by_content(i, created, True)
    changed_pre = [v for k, v in after.items() if k in before and klass(before[k].status) != klass(v.status)]
    for i in range(len(golds)):  # (5) swapped ids
        if not matched[i]:
            by_content(i, changed_pre, False)
    gold_ids = {(g.kind, g.id) for g, e in zip(golds, existed, strict=True) if e}
    strays = [v for v in free(created) if v.status != "cancelled"]
    changed = [v for v in changed_pre if (v.kind, v.id) not in used and (v.kind, v.id) not in gold_ids]
    return Verdict(matched, [g for g, m in zip(golds, matched, strict=True) if not m], strays, changed)


def end_state_score(initial: Database, final: Database, required: list[dict[str, Any]]) -> Score:
    """§7's verdict as a Score: success, the share of checks met as `value`, the parts as `subscores`."""
    verdict = compare(initial, final, required)
    strict = compare(initial, final, required, strict=True)
    n = len(verdict.matched)
    met = sum(verdict.matched)
    value = met / (n + len(verdict.strays) + len(verdict.changed)) if n else float(verdict.passed)
    notes = [f"missing {v}" for v in verdict.missing] + [f"stray {v} {v.id}" for v in verdict.strays]
    notes += [f"changed {v} {v.id}" for v in verdict.changed]
    head = f"end state: {met}/{n} required records matched ({CAVEAT})"
    return Score(verdict.passed, head + (": " + "; ".join(notes) if notes else ""), value=value,
                 subscores={"required_matched": met / n if n else 1.0,
                            "no_strays": float(not verdict.strays and not verdict.changed),
                            "strict_status": float(strict.passed)})
