"""The twelve delivery tools (TOOLS.md §5.2), upstream's quirks included (§9).

Kept on purpose: searches return every store or product, ranked; an order may hold products of other
stores and takes its shipping time from the `store_id` store; ordered copies replace the product registry's
entries; pay, cancel and modify leave `update_time` alone; `search_delivery_orders` filters on `unpaid`
by default.
"""

from __future__ import annotations

import copy
import math
from datetime import timedelta
from typing import Any

from envace.envs.vitabench.db import Location, Order, StoreProduct
from envace.envs.vitabench.fuzzy import geocode_match, keyword_query, rank
from envace.envs.vitabench.tools_shared import DATETIME, SharedTools, ToolError, haversine, parse_time


def distance_to_minutes(distance: float) -> float:
    """Delivery minutes for a distance in metres: round-half-even of 25 + trunc(m) × 0.00651, as a float."""
    return float(round(25 + math.trunc(distance) * 0.00651))


class DeliveryTools(SharedTools):
    ID_PREFIX = "OT"
    ID_TAG = "delivery"
    VENUES = "stores"
    ORDER_TYPE = "delivery"
    ORDER_NAME = "a delivery"

    def delivery_distance_to_time(self, distance: Any) -> Any:
        if not isinstance(distance, int | float):
            return f"distance must be an int or a float, got {type(distance).__name__}"
        return distance_to_minutes(distance)

    def get_delivery_store_info(self, store_id: str) -> str:
        store = self.db.stores.get(store_id)
        if store is None:
            raise ToolError(f"store {store_id} not found")
        return store.long_form()

    def get_delivery_product_info(self, product_id: str) -> str:
        product = self.db.products.get(product_id)
        if product is None:
            raise ToolError(f"{product_id} not found")
        return str(product)

    def delivery_store_search_recommand(self, keywords: list[str]) -> str:
        ranked = rank(keyword_query(keywords), self._venues(), lambda s: s.name + ",".join(s.tags))
        return "\n".join(str(s) for s in ranked)

    def delivery_product_search_recommand(self, keywords: list[str]) -> str:
        products = [self.db.products.get(p.product_id, p) for s in self._venues() for p in s.products]
        ranked = rank(keyword_query(keywords), products, lambda p: f"{p.store_name} {p.name} {p.tags}")
        return "\n".join(str(p) for p in ranked)

    def create_delivery_order(self, user_id: str, store_id: str, product_ids: list[str], product_cnts: list[int],
                              address: str, dispatch_time: str, attributes: list[str] | None = None,
                              note: str = "") -> str:
        problem = self._user_problem(user_id)
        if problem:
            return problem
        store = self.db.stores.get(store_id)
        if store is None:
            return f"store {store_id} not found"
        for product_id in product_ids:  # products of any store are accepted (observed upstream)
            if product_id not in self.db.products:
                raise ToolError(f"{product_id} not found")
        if not address:
            return "address cannot be empty."
        if len(product_ids) != len(product_cnts) or any(not count > 0 for count in product_cnts):
            return "product_cnts is invalid: it must have one count greater than 0 per product."
        dispatch = parse_time(dispatch_time, DATETIME) if dispatch_time else None
        if dispatch is None:
            return "dispatch_time must be in the format YYYY-MM-DD HH:MM:SS."
        if dispatch < parse_time(self.db.time, DATETIME):
            return f"dispatch_time {dispatch_time} must not be earlier than the current time {self.db.time}."
        matched = geocode_match(address, list(self.db.addresses))
        if matched is None:
            raise ToolError(f"No longitude and latitude found for address {address}")
        point = self.db.addresses[matched]
        shipping = distance_to_minutes(haversine(point.longitude, point.latitude, store.location.longitude,
                                                 store.location.latitude))
        ordered: list[StoreProduct] = []
        total = 0
        for i, (product_id, count) in enumerate(zip(product_ids, product_cnts, strict=True)):
            item = copy.copy(self.db.products[product_id])
            chosen = attributes[i] if attributes is not None and i < len(attributes) else ""
            item.quantity, item.attributes = count, chosen if chosen else ""
            item.tags = list(item.tags)
            total += item.price * count
            self.db.products[product_id] = item  # the ordered copy replaces the registry entry (§2)
            ordered.append(item)
        location = Location(address, point.longitude, point.latitude)
        self.db.addresses[address] = location
        order = Order(order_id=self._new_id(), order_type="delivery", user_id=user_id, store_id=store_id,
                      status="unpaid", products=ordered, total_price=float(total), note=note, location=location,
                      dispatch_time=dispatch_time, shipping_time=shipping,
                      delivery_time=(dispatch + timedelta(minutes=shipping)).strftime(DATETIME),
                      create_time=self.db.time, update_time=self.db.time)
        self.db.orders[order.order_id] = order
        return str(order)

    def pay_delivery_order(self, order_id: str) -> str:
        order = self._order(order_id)
        if order.status != "unpaid":
            return f"Order {order_id} is not in unpaid status and cannot be paid."
        order.status = "paid"
        return "Payment successful"

    def get_delivery_order_status(self, order_id: str) -> str:
        return self._order(order_id).status

    def cancel_delivery_order(self, order_id: str) -> str:
        order = self._order(order_id)
        if order.status == "cancelled":
            return f"Order {order_id} is already cancelled."
        order.status = "cancelled"
        return f"Order {order_id} has been cancelled."

    def modify_delivery_order(self, order_id: str, note: str) -> str:
        self._order(order_id).note = note
        return f"Order {order_id} has been modified."

    def search_delivery_orders(self, user_id: str, status: str = "unpaid") -> str:
        problem = self._user_problem(user_id)
        if problem:
            return problem
        found = [o for o in self.db.orders.values()
                 if o.order_type == "delivery" and o.user_id == user_id and o.status == status]
        return "\n".join(o.short_form() for o in found) if found else "No delivery orders available"

    def get_delivery_order_detail(self, order_id: str) -> str:
        if not order_id:
            return "order_id cannot be empty."
        return str(self._order(order_id))
