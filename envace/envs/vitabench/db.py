"""The episode's database (TOOLS.md §2) and the text forms its records print as (§3).

One `Database` per episode, built from a task's `environment` with upstream's load-time normalization,
because it shows in tool outputs: numeric fields become floats (`25` prints `25.0`), delivery product
`attributes` become one ", "-joined string, unknown order keys are dropped (in-store `order_time`, so those
orders print an empty `create_time`), and initial orders keep their `products` as the raw dicts of the data.

The two registries of §2 live here too, since they change what tools show: `products` (id → the record a
lookup by id sees; delivery orders replace entries with ordered copies, in-store orders mutate them) and
`addresses` (text → coordinates, the geocoding candidates; delivery orders add the typed address).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

ORDER_KEYS = ("order_id", "order_type", "user_id", "store_id", "note", "location", "dispatch_time",
              "shipping_time", "delivery_time", "total_price", "create_time", "update_time", "status",
              "products")


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _from_data(cls: Any, raw: dict[str, Any]) -> Any:
    """A flat record from its data: each field by name, its default where the data lacks it, floats as floats."""
    return cls(**{f.name: _float(raw.get(f.name, f.default)) if f.type == "float" else raw.get(f.name, f.default)
                  for f in fields(cls)})


def _form(record: Any, *names: str) -> str:
    """Upstream's `Class(name=value, …)` text of a record, its fields in the order upstream prints them."""
    return f"{type(record).__name__}(" + ", ".join(f"{name}={getattr(record, name)}" for name in names) + ")"


@dataclass
class Location:
    address: str
    longitude: float
    latitude: float

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Location:
        return cls(raw.get("address", ""), _float(raw.get("longitude")), _float(raw.get("latitude")))

    def __str__(self) -> str:
        return f"{self.address} longitude:{self.longitude},latitude:{self.latitude}"


@dataclass
class StoreProduct:
    product_id: str
    name: str
    store_id: str
    store_name: str
    price: float
    tags: list[str]
    attributes: str = ""
    quantity: int = 0

    def __repr__(self) -> str:  # lists of products print their items with repr
        return (f"StoreProduct(store_name={self.store_name}, store_id={self.store_id}, product_name={self.name}, "
                f"product_id={self.product_id}, attributes={self.attributes}, quantity={self.quantity}, "
                f"price={self.price}, tags={self.tags})")

    __str__ = __repr__


@dataclass
class Store:
    store_id: str
    name: str
    score: float
    location: Location
    tags: list[str]
    products: list[StoreProduct]

    def __str__(self) -> str:
        return _form(self, "name", "store_id", "score", "location", "tags")

    def long_form(self) -> str:
        """get_delivery_store_info's form: no closing bracket after the product lines (upstream's)."""
        return f"{self}, products=" + "\n".join(str(p) for p in self.products)


@dataclass
class ShopProduct:
    shop_id: str
    product_id: str
    name: str
    price: float
    quantity: int
    tags: list[str]

    def __repr__(self) -> str:
        return _form(self, "shop_id", "product_id", "name", "price", "quantity", "tags")

    __str__ = __repr__


@dataclass
class Shop:
    shop_id: str
    shop_name: str
    score: float
    location: Location
    tags: list[str]
    enable_book: bool
    book_price: float
    enable_reservation: bool
    products: list[ShopProduct]

    def __str__(self) -> str:  # its products left out (upstream's)
        return _form(self, "shop_name", "shop_id", "score", "location", "tags", "enable_book", "book_price",
                     "enable_reservation")


@dataclass
class Order:
    order_id: str
    order_type: str
    user_id: str
    store_id: str
    status: str
    products: list[Any]  # raw dicts for initial orders, product records for orders the tools created
    total_price: float = 0.0
    note: Any = ""
    location: Location | None = None
    dispatch_time: str = ""
    shipping_time: float | None = None
    delivery_time: str = ""
    create_time: str = ""
    update_time: str = ""

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Order:
        known = {k: copy.deepcopy(raw[k]) for k in ORDER_KEYS if k in raw}
        location = known.pop("location", None)
        order = cls(**{"order_id": "", "order_type": "", "user_id": "", "store_id": "", "status": "",
                       "products": [], **known})
        order.location = Location.of(location) if isinstance(location, dict) else None
        order.total_price = _float(order.total_price)
        order.shipping_time = _float(order.shipping_time)
        order.create_time = order.create_time or ""
        if not order.update_time and order.create_time:
            order.update_time = order.create_time
        return order

    def __str__(self) -> str:
        if self.order_type == "instore":
            return (f"Order(order_id:{self.order_id}, order_type:instore, user_id:{self.user_id}, "
                    f"shop_id:{self.store_id}, total_price:{self.total_price}, create_time:{self.create_time}, "
                    f"update_time:{self.update_time}, status:{self.status}, products:{self.products})")
        return (f"Order(order_id:{self.order_id}, order_type:{self.order_type}, user_id:{self.user_id}, "
                f"store_id:{self.store_id}, dispatch_time:{self.dispatch_time}, shipping_time:{self.shipping_time}, "
                f"delivery_time:{self.delivery_time}, total_price:{self.total_price}, "
                f"create_time:{self.create_time}, update_time:{self.update_time}, note:{self.note}, "
                f"status:{self.status}, products:{self.products})")

    def short_form(self) -> str:
        """search_delivery_orders' form: ends with ", " and no closing parenthesis (upstream's)."""
        return (f"Order(order_id:{self.order_id}, order_type:{self.order_type}, user_id:{self.user_id}, "
                f"store_id:{self.store_id}, total_price:{self.total_price}, create_time:{self.create_time}, "
                f"update_time:{self.update_time}, status:{self.status}, ")


@dataclass
class Appointment:
    """What a table booking and a service reservation share: a customer's party at a shop, and its status."""

    shop_id: str = ""
    customer_id: str = ""
    customer_count: int = 1
    update_time: str = ""
    status: str = ""


@dataclass
class Booking(Appointment):
    book_id: str = ""
    book_time: str = ""
    book_price: float = 0.0

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Booking:
        return _from_data(cls, raw)

    def __str__(self) -> str:  # no space after the first comma, no closing parenthesis (upstream's)
        return (f"BookInfo(book_id={self.book_id},shop_id={self.shop_id}, book_time={self.book_time}, "
                f"customer_id={self.customer_id}, customer_count={self.customer_count}, "
                f"book_price={self.book_price}, status={self.status}")


@dataclass
class Reservation(Appointment):
    reservation_id: str = ""
    reservation_time: str = ""

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Reservation:
        return _from_data(cls, raw)

    def __str__(self) -> str:
        return (f"ReservationInfo(reservation_id={self.reservation_id},shop_id={self.shop_id}, "
                f"reservation_time={self.reservation_time}, customer_id={self.customer_id}, "
                f"customer_count={self.customer_count}, status={self.status}")


@dataclass
class Weather:
    city: str
    category: str
    datetime: str
    temperature: list[float]
    humidity: float

    def __str__(self) -> str:
        low, high = (self.temperature + [None, None])[:2]
        return (f"city: {self.city}, weather: {self.category}, datetime: {self.datetime}, "
                f"temperature: {low}~{high}, humidity: {self.humidity}")


def _store(raw: dict[str, Any]) -> Store:
    products = []
    for p in raw.get("products", []):
        attributes = p.get("attributes", p.get("attribute", []))
        products.append(StoreProduct(
            p["product_id"], p.get("name", ""), p.get("store_id", raw["store_id"]), p.get("store_name", raw["name"]),
            _float(p.get("price", 0.0)), list(p.get("tags", [])),
            ", ".join(attributes) if isinstance(attributes, list) else str(attributes or ""),
            p.get("quantity", 0)))
    return Store(raw["store_id"], raw.get("name", ""), _float(raw.get("score", 0.0)), Location.of(raw["location"]),
                 list(raw.get("tags", [])), products)


def _shop(raw: dict[str, Any]) -> Shop:
    products = [ShopProduct(p.get("shop_id", raw["shop_id"]), p["product_id"], p.get("name", ""),
                            _float(p.get("price", 0.0)), p.get("quantity", 0), list(p.get("tags", [])))
                for p in raw.get("products", [])]
    return Shop(raw["shop_id"], raw.get("shop_name", ""), _float(raw.get("score", 0.0)), Location.of(raw["location"]),
                list(raw.get("tags", [])), bool(raw.get("enable_book", False)), _float(raw.get("book_price", 0.0)),
                bool(raw.get("enable_reservation", False)), products)


@dataclass
class Database:
    """Everything one episode's tools read and write. Stores (delivery) or shops (in-store), never both."""

    time: str
    user_id: str
    behaviors: dict[str, Any]
    weather: list[Weather]
    locations: list[Location]
    orders: dict[str, Order]
    stores: dict[str, Store] = field(default_factory=dict)
    shops: dict[str, Shop] = field(default_factory=dict)
    books: dict[str, Booking] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    products: dict[str, Any] = field(default_factory=dict)  # the product registry of §2
    addresses: dict[str, Location] = field(default_factory=dict)  # the address registry of §2
    created: int = 0  # records the tools created: feeds new ids

    @classmethod
    def of(cls, environment: dict[str, Any]) -> Database:
        env = copy.deepcopy(environment)
        db = cls(
            time=env["time"], user_id=env["user_id"], behaviors=env.get("user_historical_behaviors") or {},
            weather=[Weather(w.get("city", ""), w.get("category", ""), w.get("datetime", ""),
                             [_float(t) for t in w.get("temperature", [])], _float(w.get("humidity")))
                     for w in env.get("weather") or []],
            locations=[Location.of(loc) for loc in env.get("location") or []],
            orders={key: Order.of(o) for key, o in (env.get("orders") or {}).items()},
            stores={key: _store(s) for key, s in (env.get("stores") or {}).items()},
            shops={key: _shop(s) for key, s in (env.get("shops") or {}).items()},
            books={key: Booking.of(b) for key, b in (env.get("books") or {}).items()},
            reservations={key: Reservation.of(r) for key, r in (env.get("reservations") or {}).items()},
        )
        for venue in list(db.stores.values()) + list(db.shops.values()):
            for product in venue.products:  # data order; a later duplicate id wins
                db.products[product.product_id] = product
        for loc in db.locations + [o.location for o in db.orders.values() if o.location] + \
                [v.location for v in list(db.stores.values()) + list(db.shops.values())]:
            db.addresses[loc.address] = loc
        return db
