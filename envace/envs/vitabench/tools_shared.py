"""The eight tools both domains share (TOOLS.md §5.1), and what every toolbox needs.

A toolbox is a class whose public methods are the tools, called with the call's JSON arguments as keyword
arguments, so a wrong argument set fails with Python's own message, as upstream's does (§1). A tool
returns the text (or number, or list) the agent sees; a *soft* failure is such a returned sentence, a
*hard* one is a raised exception, which the environment turns into `Error: <text>` with the error flag.
Soft-failure sentences are not given verbatim by the spec; ours say what it says they say.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime
from functools import cache
from typing import Any

from envace.envs.vitabench.db import Database
from envace.envs.vitabench.fuzzy import best, geocode_match

DATE = "%Y-%m-%d"
DATETIME = "%Y-%m-%d %H:%M:%S"

# get_holiday_date's fixed table (§5.1): year → (English name, Chinese name, MM-DD), in table order.
HOLIDAYS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "2025": (("New Year's Day", "元旦", "01-01"), ("Start of Autumn", "立秋", "08-07"),
             ("Women's Day", "妇女节", "03-08"), ("Laba Festival", "腊八节", "01-07"),
             ("Dragon Head Festival", "龙抬头", "03-01"), ("Party Founding Day", "建党节", "07-01"),
             ("Qingming Festival", "清明节", "04-04"), ("Double Ninth Festival", "重阳节", "10-29"),
             ("Dragon Boat Festival", "端午节", "05-31"), ("Mother's Day", "母亲节", "05-11"),
             ("Lantern Festival", "元宵节", "02-15"), ("Labor Day", "劳动节", "05-01"),
             ("Qixi Festival", "七夕节", "08-29"), ("Winter Solstice", "冬至", "12-21"),
             ("Christmas Day", "圣诞节", "12-25"), ("National Day", "国庆节", "10-01"),
             ("Mid-Autumn Festival", "中秋节", "10-06")),
    "2024": (("Double Ninth Festival", "重阳节", "10-11"), ("Qixi Festival", "七夕节", "08-10"),
             ("Valentine's Day", "情人节", "02-14"), ("Qingming Festival", "清明节", "04-04"),
             ("Dragon Boat Festival", "端午节", "06-10"), ("Lantern Festival", "元宵节", "02-24"),
             ("Mid-Autumn Festival", "中秋节", "09-17")),
    "2023": (("National Day", "国庆节", "10-01"), ("Dragon Boat Festival", "端午节", "06-22"),
             ("Mid-Autumn Festival", "中秋节", "09-29"), ("Qingming Festival", "清明节", "04-05"),
             ("Double Ninth Festival", "重阳节", "10-23"), ("Father's Day", "父亲节", "06-18")),
}


class ToolError(Exception):
    """A hard failure: the agent sees `Error: <message>` with the error flag set."""


def parse_time(value: Any, fmt: str) -> datetime | None:
    """The value as a datetime when it has exactly the format `fmt`, else None (strict, §1)."""
    try:
        return datetime.strptime(value, fmt)
    except (TypeError, ValueError):
        return None


def haversine(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    """Great-circle metres on a 6,371,000 m sphere, rounded to a whole metre (a float, as upstream's)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return float(round(2 * 6371000 * math.asin(math.sqrt(a))))


@cache
def _china_holidays(year: int) -> Any:
    import holidays  # the answer depends on its version (§9.11); imported on first use only

    return holidays.country_holidays("CN", years=year)


class SharedTools:
    """The shared tools over one episode's database. `lang` ("en"/"zh") picks the holiday table's names."""

    ID_PREFIX = ""
    ID_TAG = ""
    VENUES = ""  # the database table of this domain's venues (stores or shops)
    ORDER_TYPE = ""  # the order_type of this domain's orders, and how a message names it
    ORDER_NAME = ""

    def __init__(self, db: Database, lang: str = "en") -> None:
        self.db, self.lang = db, lang

    # -- helpers (never tools: the dispatcher only calls names in the task's schemas) --------------

    def _venues(self) -> list[Any]:
        return list(getattr(self.db, self.VENUES).values())

    def _order(self, order_id: str) -> Any:
        """This domain's order `order_id`, or the hard failure upstream raises for a missing or foreign one."""
        order = self.db.orders.get(order_id)
        if order is None:
            raise ToolError(f"order {order_id} not found")
        if order.order_type != self.ORDER_TYPE:
            raise ToolError(f"order {order_id} is not {self.ORDER_NAME} order")
        return order

    def _user_problem(self, user_id: Any) -> str | None:
        """The soft failure for a user id other than the task's, else None (empty and wrong differ)."""
        if not user_id:
            return "user_id cannot be empty."
        if user_id != self.db.user_id:
            return f"User {user_id} does not match the current user."
        return None

    def _new_id(self) -> str:
        """A fresh id: prefix + 10 hex digits of SHA-256. Upstream hashes the wall clock; this hashes a
        per-episode counter, so replaying the same calls gives the same ids (scoring replays them)."""
        taken = set(self.db.orders) | set(self.db.books) | set(self.db.reservations)
        while True:
            self.db.created += 1
            seed = f"{self.ID_TAG}{self.db.user_id}{self.db.time}#{self.db.created}"
            new = self.ID_PREFIX + hashlib.sha256(seed.encode()).hexdigest()[:10]
            if new not in taken:
                return new

    # -- tools ----------------------------------------------------------------------------------

    def longitude_latitude_to_distance(self, longitude1: float, latitude1: float, longitude2: float,
                                       latitude2: float) -> float:
        return haversine(longitude1, latitude1, longitude2, latitude2)

    def weather(self, address: str, date_start: str, date_end: str) -> str:
        for value in (date_start, date_end):
            if parse_time(value, DATE) is None:
                return f"Invalid date format: {value}. The date must be in YYYY-MM-DD format."
        cities = list(dict.fromkeys(w.city for w in self.db.weather))
        top = best(address, cities)
        if top is None or top[1] < 50:
            raise ToolError(f"No weather information found for address {address}")
        found = sorted((w for w in self.db.weather if w.city == top[0] and date_start <= w.datetime <= date_end),
                       key=lambda w: w.datetime)
        if not found:
            return f"No weather information for {top[0]} from {date_start} to {date_end}."
        return "\n".join(str(w) for w in found)

    def address_to_longitude_latitude(self, address: str) -> list[float]:
        matched = geocode_match(address, list(self.db.addresses))
        if matched is None:
            raise ToolError(f"No longitude and latitude found for address {address}")
        loc = self.db.addresses[matched]
        return [loc.longitude, loc.latitude]

    def get_date_holiday_info(self, date: str) -> str:
        day = parse_time(date, DATE)
        if day is None:
            return f"Invalid date format: {date}. The date must be in YYYY-MM-DD format."
        name = _china_holidays(day.year).get(day.date())
        return name if name else f"{date} is not a holiday."

    def get_holiday_date(self, year: str, holiday_name: str) -> str:
        table = HOLIDAYS.get(year) if isinstance(year, str) else None
        if table is None:
            return f"No holiday data for the year {year}."
        names = [entry[1] if self.lang == "zh" else entry[0] for entry in table]
        top = best(holiday_name, names)
        if top is None or top[1] < 80:
            return f"Holiday {holiday_name} was not found in {year}."
        return f"{year}-{table[names.index(top[0])][2]}"

    def get_user_historical_behaviors(self) -> str:
        return str(self.db.behaviors)

    def get_user_all_orders(self) -> str:
        return "\n".join(str(order) for order in self.db.orders.values())

    def get_nearby(self, longitude: float, latitude: float, range: float) -> str:  # `range`: the schema's name
        near = [v for v in self._venues()
                if haversine(longitude, latitude, v.location.longitude, v.location.latitude) <= range]
        return "\n".join(str(v) for v in near) if near else "No search results found"
