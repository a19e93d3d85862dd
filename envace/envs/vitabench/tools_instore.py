"""The sixteen in-store tools (TOOLS.md §5.3), upstream's quirks included (§9).

Kept on purpose: one product per order, taken from the product registry (with a duplicate id, another
shop's record and price) and sharing that object, whose `quantity` each order overwrites in place, so
earlier orders of it show the later quantity; every write sets `update_time` to now; a free booking starts
`paid`; `instore_reservation` ignores `enable_reservation`; `instore_modify_reservation` sets the count to
0 when it is omitted.
"""

from __future__ import annotations

from typing import Any

from envace.envs.vitabench.db import Booking, Order, Reservation
from envace.envs.vitabench.fuzzy import keyword_query, rank
from envace.envs.vitabench.tools_shared import DATETIME, SharedTools, ToolError, parse_time


class InstoreTools(SharedTools):
    ID_PREFIX = "OI"
    ID_TAG = "instore"
    VENUES = "shops"
    ORDER_TYPE = "instore"
    ORDER_NAME = "an in-store"

    def _record(self, table: dict[str, Any], kind: str, record_id: str) -> Any:
        if record_id not in table:
            raise ToolError(f"{kind} {record_id} not found")
        return table[record_id]

    def _user_shop_problem(self, user_id: str, shop_id: str) -> str | None:
        """What stops a user's order, booking or reservation at a shop before its own checks."""
        return self._user_problem(user_id) or (None if shop_id in self.db.shops else f"shop {shop_id} not found")

    def _time_problem(self, time: Any) -> str | None:
        if parse_time(time, DATETIME) is None:
            return f"Invalid time format: {time}. The time must be in the format YYYY-MM-DD HH:MM:SS."
        return None

    # -- search and orders ----------------------------------------------------------------------

    def instore_shop_search_recommend(self, keywords: list[str]) -> str:
        ranked = rank(keyword_query(keywords), self._venues(),
                            lambda s: f"{s.shop_name},{','.join(s.tags)}")
        return "\n".join(str(s) for s in ranked)

    def instore_product_search_recommend(self, keywords: list[str]) -> str:
        products = [self.db.products.get(p.product_id, p) for s in self._venues() for p in s.products]
        ranked = rank(keyword_query(keywords), products, lambda p: f"{p.name},{','.join(p.tags)}")
        return "\n".join(str(p) for p in ranked)

    def create_instore_product_order(self, user_id: str, shop_id: str, product_id: str, quantity: int = 1) -> str:
        problem = self._user_shop_problem(user_id, shop_id)
        if problem:
            return problem
        shop = self.db.shops[shop_id]
        if product_id not in {p.product_id for p in shop.products}:
            return f"product {product_id} not found in shop {shop_id}"
        if quantity <= 0:
            return "quantity must be greater than 0."
        product = self.db.products[product_id]
        product.quantity = quantity  # in place: the shop listing and earlier orders show it (§2)
        order = Order(order_id=self._new_id(), order_type="instore", user_id=user_id, store_id=shop_id,
                      status="unpaid", products=[product], total_price=float(quantity * product.price),
                      shipping_time=0.0, create_time=self.db.time, update_time=self.db.time)  # upstream's 0.0
        self.db.orders[order.order_id] = order
        return str(order)

    def pay_instore_order(self, order_id: str) -> str:
        if not order_id:
            return "order_id cannot be empty."
        order = self._order(order_id)
        if order.status != "unpaid":
            return f"Order {order_id} is not in unpaid status and cannot be paid."
        order.status, order.update_time = "paid", self.db.time
        return "Payment successful"

    def instore_cancel_order(self, order_id: str) -> str:
        if not order_id:
            return "order_id cannot be empty."
        order = self._order(order_id)
        if order.status == "cancelled":
            return f"Order {order_id} is already cancelled."
        order.status, order.update_time = "cancelled", self.db.time
        return f"Order {order_id} is cancelled."

    def get_instore_orders(self, user_id: str) -> str:
        problem = self._user_problem(user_id)
        if problem:
            return problem
        found = [o for o in self.db.orders.values() if o.order_type == "instore" and o.user_id == user_id]
        return "\n".join(str(o) for o in found) if found else f"User {user_id} has no order information."

    # -- bookings (tables, possibly with a fee) ---------------------------------------------------

    def instore_book(self, user_id: str, shop_id: str, time: str, customer_count: int = 1) -> str:
        problem = self._user_shop_problem(user_id, shop_id)
        if problem:
            return problem
        shop = self.db.shops[shop_id]
        if customer_count <= 0:
            return "customer_count must be greater than 0."
        if not time:
            return "time cannot be empty."
        problem = self._time_problem(time)
        if problem:
            return problem
        if not shop.enable_book:
            return f"Shop {shop_id} does not accept seat bookings."
        book = Booking(book_id=self._new_id(), shop_id=shop_id, book_time=time, update_time=self.db.time,
                       customer_id=user_id, customer_count=customer_count, book_price=shop.book_price,
                       status="unpaid" if shop.book_price > 0 else "paid")
        self.db.books[book.book_id] = book
        return str(book)

    def pay_instore_book(self, book_id: str) -> str:
        if not book_id:
            return "book_id cannot be empty."
        book = self._record(self.db.books, "BookInfo", book_id)
        if book.status != "unpaid":
            return f"BookInfo {book_id} is not in unpaid status and cannot be paid."
        book.status, book.update_time = "paid", self.db.time
        return "Payment successful"

    # Bookings and reservations are cancelled, listed and looked up alike; only the table and the texts differ.
    def _cancel(self, table: dict, kind: str, id_name: str, record_id: str) -> str:
        if not record_id:
            return f"{id_name} cannot be empty."
        record = self._record(table, kind, record_id)
        if record.status == "cancelled":
            return f"{kind} {record_id} is already cancelled."
        record.status, record.update_time = "cancelled", self.db.time
        return f"{kind} {record_id} is cancelled."

    def _user_records(self, table: dict, user_id: str, none_text: str) -> str:
        problem = self._user_problem(user_id)
        if problem:
            return problem
        found = [r for r in table.values() if r.customer_id == user_id]
        return "\n".join(str(r) for r in found) if found else f"User {user_id} has no {none_text}."

    def _search(self, table: dict, kind: str, none_text: str, user_id: str, record_id: str | None) -> str:
        if record_id is None:
            return self._user_records(table, user_id, none_text)
        problem = self._user_problem(user_id)
        if problem:
            return problem
        record = self._record(table, kind, record_id)
        if record.customer_id != user_id:
            return f"{kind} {record_id} does not belong to user {user_id}."
        return str(record)

    # -- reservations (free service appointments) -------------------------------------------------

    def instore_reservation(self, user_id: str, shop_id: str, time: str, customer_count: int = 1) -> str:
        problem = self._user_shop_problem(user_id, shop_id)
        if problem:
            return problem
        problem = self._time_problem(time)
        if problem:
            return problem
        if customer_count <= 0:
            return "customer_count must be greater than 0."
        reservation = Reservation(reservation_id=self._new_id(), shop_id=shop_id, reservation_time=time,
                                  update_time=self.db.time, customer_id=user_id, customer_count=customer_count,
                                  status="unconsumed")
        self.db.reservations[reservation.reservation_id] = reservation
        return str(reservation)

    def instore_modify_reservation(self, reservation_id: str, time: str, customer_count: int = 0) -> str:
        if not reservation_id:
            return "reservation_id cannot be empty."
        reservation = self._record(self.db.reservations, "ReservationInfo", reservation_id)
        if reservation.status in ("consumed", "cancelled"):
            return f"ReservationInfo {reservation_id} is already {reservation.status} and cannot be modified."
        if customer_count < 0:
            return "customer_count must not be negative."
        if not time:
            return "time cannot be empty."
        problem = self._time_problem(time)
        if problem:
            return problem
        reservation.reservation_time, reservation.customer_count = time, customer_count
        reservation.update_time = self.db.time
        return str(reservation)

    # -- cancelling, listing and looking up (the same for both tables) ----------------------------

    def instore_cancel_book(self, book_id: str) -> str:
        return self._cancel(self.db.books, "BookInfo", "book_id", book_id)

    def instore_cancel_reservation(self, reservation_id: str) -> str:
        return self._cancel(self.db.reservations, "ReservationInfo", "reservation_id", reservation_id)

    def get_instore_books(self, user_id: str) -> str:
        return self._user_records(self.db.books, user_id, "seat booking information")

    def get_instore_reservations(self, user_id: str) -> str:
        return self._user_records(self.db.reservations, user_id, "reservation information")

    def search_instore_book(self, user_id: str, book_id: str | None = None) -> str:
        return self._search(self.db.books, "BookInfo", "seat booking information", user_id, book_id)

    def search_instore_reservation(self, user_id: str, reservation_id: str | None = None) -> str:
        return self._search(self.db.reservations, "ReservationInfo", "reservation information", user_id,
                            reservation_id)
