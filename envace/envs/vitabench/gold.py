"""Gold actions built from `required_orders` (TOOLS.md §8): the task data has no action sequence of its own.

For each required record, in the order of the data:
- a new delivery order: `create_delivery_order` with the gold store, products, counts, attributes, note and
  address, dispatched at the gold time when it is set and not in the past, else now; then pay it unless
  the gold is `unpaid`, and cancel it if it is `cancelled`;
- a new in-store order: one `create_instore_product_order` per product, each paid or cancelled the same way;
- a new booking: `instore_book`, paid when the shop charges and the gold is not `unpaid`, cancelled if so;
- a new reservation: `instore_reservation`, cancelled if the gold is;
- a record that existed at the start: cancelled if the gold is and it is not, paid if the gold is paid-like
  and it is `unpaid`, and (delivery) its note changed with `modify_delivery_order` when it differs. Product
  or store changes cannot be replayed: no tool edits them.
Later calls need the ids the create calls return; they are read from the episode's database. A create call
that fails (the gold asks for something the database lacks) is kept, and the calls that needed it are not.
"""

from __future__ import annotations

from typing import Any

from envace.envs.vitabench.scoring import gold_view
from envace.envs.vitabench.tools_shared import DATETIME, parse_time
from envace.types import ReferenceStep, ToolCall

UNPAID, CANCELLED = "unpaid", "cancelled"


def _attributes(product: dict[str, Any]) -> str:
    value = product.get("attributes", product.get("attribute", ""))
    return ", ".join(value) if isinstance(value, list) else str(value or "")


class _Replay:
    """Runs gold calls on one environment, keeping each call with its real result."""

    def __init__(self, env: Any) -> None:
        self.env, self.steps = env, []

    def run(self, name: str, **arguments: Any) -> None:
        call = ToolCall(name, arguments)
        self.steps.append(ReferenceStep(call=call, result=self.env.execute(call)))

    def create(self, table: dict[str, Any], name: str, **arguments: Any) -> str | None:
        """A create call; the id of the record it added, or None when it added nothing."""
        before = set(table)
        self.run(name, **arguments)
        return next((key for key in table if key not in before), None)


def _delivery_order(replay: _Replay, record: dict[str, Any], db: Any) -> None:
    products = [p for p in record.get("products") or [] if not (isinstance(p, dict) and "order_id" in p)]
    dispatch = str(record.get("dispatch_time") or "").strip()
    dispatch = dispatch + ":00" if len(dispatch) == 16 else dispatch
    when = parse_time(dispatch, DATETIME)
    if when is None or when < parse_time(db.time, DATETIME):
        dispatch = db.time
    location = record.get("location") if isinstance(record.get("location"), dict) else {}
    address = location.get("address") or (db.locations[0].address if db.locations else "")
    order_id = replay.create(
        db.orders, "create_delivery_order", user_id=db.user_id, store_id=str(record.get("store_id", "")).strip(),
        product_ids=[str(p.get("product_id", "")).strip() for p in products],
        product_cnts=[p.get("quantity", 1) for p in products], address=address, dispatch_time=dispatch,
        attributes=[_attributes(p) for p in products], note=record.get("note") or "")
    _settle(replay, "delivery", order_id, record.get("status"))


def _settle(replay: _Replay, domain: str, order_id: str | None, status: Any) -> None:
    if order_id is None:
        return
    if status != UNPAID:
        replay.run("pay_delivery_order" if domain == "delivery" else "pay_instore_order", order_id=order_id)
    if status == CANCELLED:
        replay.run("cancel_delivery_order" if domain == "delivery" else "instore_cancel_order", order_id=order_id)


def _new_record(replay: _Replay, domain: str, record: dict[str, Any], db: Any) -> None:
    view = gold_view(record)
    status = record.get("status")
    if view.kind == "order" and domain == "delivery":
        _delivery_order(replay, record, db)
    elif view.kind == "order":
        for product_id, quantity in ((str(p.get("product_id", "")).strip(), p.get("quantity", 1))
                                     for p in record.get("products") or [] if "order_id" not in p):
            order_id = replay.create(db.orders, "create_instore_product_order", user_id=db.user_id,
                                     shop_id=view.venue, product_id=product_id, quantity=quantity)
            _settle(replay, domain, order_id, status)
    elif view.kind == "booking":
        book_id = replay.create(db.books, "instore_book", user_id=db.user_id, shop_id=view.venue, time=view.key[1],
                                customer_count=view.key[2] or 1)
        shop = db.shops.get(view.venue)
        if book_id and shop is not None and shop.book_price > 0 and status != UNPAID:
            replay.run("pay_instore_book", book_id=book_id)
        if book_id and status == CANCELLED:
            replay.run("instore_cancel_book", book_id=book_id)
    else:
        reservation_id = replay.create(db.reservations, "instore_reservation", user_id=db.user_id,
                                       shop_id=view.venue, time=view.key[1], customer_count=view.key[2] or 1)
        if reservation_id and status == CANCELLED:
            replay.run("instore_cancel_reservation", reservation_id=reservation_id)


def _existing_record(replay: _Replay, domain: str, record: dict[str, Any], db: Any) -> None:
    view = gold_view(record)
    status = record.get("status")
    table = {"order": db.orders, "booking": db.books, "reservation": db.reservations}[view.kind]
    current = table[view.id]
    names = {("order", "delivery"): ("cancel_delivery_order", "pay_delivery_order", "order_id"),
             ("order", "instore"): ("instore_cancel_order", "pay_instore_order", "order_id"),
             ("booking", "instore"): ("instore_cancel_book", "pay_instore_book", "book_id"),
             ("reservation", "instore"): ("instore_cancel_reservation", None, "reservation_id")}
    cancel, pay, key = names[(view.kind, domain)]
    if status == CANCELLED and current.status != CANCELLED:
        replay.run(cancel, **{key: view.id})
    elif pay and status not in (UNPAID, CANCELLED) and current.status == UNPAID:
        replay.run(pay, **{key: view.id})
    if view.kind == "order" and domain == "delivery" and (record.get("note") or "") != (current.note or ""):
        replay.run("modify_delivery_order", order_id=view.id, note=record.get("note") or "")


def replay_gold(env: Any, required: list[dict[str, Any]], domain: str) -> list[ReferenceStep]:
    """The gold calls for `required` run on `env` (fresh, reset to the task), each with its real result."""
    replay = _Replay(env)
    db = env.db
    existing = {("order", k) for k in db.orders} | {("booking", k) for k in db.books} | \
        {("reservation", k) for k in db.reservations}
    for record in required:
        view = gold_view(record)
        if (view.kind, view.id) in existing:
            _existing_record(replay, domain, record, db)
        else:
            _new_record(replay, domain, record, db)
    return replay.steps
