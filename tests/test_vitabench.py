"""VitaBench delivery and in-store: tools against TOOLS.md, gold replay, the §7 end-state check, splits, users."""

import gzip
import json

import pytest

from envace.envs import registry
from envace.envs.base import Environment
from envace.envs.check import check_category, known_failures, problems
from envace.envs.vitabench import CATEGORIES, VitaBenchEnv, load_task, load_tasks
from envace.envs.vitabench.data import KNOWN_DEFECTS, data_dir, read_schemas, read_tasks
from envace.envs.vitabench.scoring import CAVEAT
from envace.envs.vitabench.user import GREETING, user_system_prompt
from envace.errors import UsageError
from envace.types import Score, Task, ToolCall

UNREACHABLE = {"delivery": {"80715001", "I0716002"}, "instore": {"10826019", "10826031", "10826084"}}
CREATES = ("create_delivery_order", "create_instore_product_order", "instore_book", "instore_reservation")


def replay_score(task: Task) -> Score:
    """The end-state verdict on the task's own gold calls, each its own step."""
    env = VitaBenchEnv()
    env.reset(task)
    return env.score(task, [[[ref.call] for ref in turn] for turn in task.reference])


def _episode(category, task_id):
    task = load_task(category, task_id)
    env = VitaBenchEnv()
    env.reset(task)
    return task, env


def _run(env, name, **arguments):
    return env.execute(ToolCall(name, arguments))


def _steps(calls):
    return [[[call] for call in calls]]


def _created_id(content, key):
    return content.split(key, 1)[1].split(",", 1)[0]


def test_registry_entry_and_categories():
    bench = registry.get("vitabench")
    assert bench.categories == CATEGORIES and bench.default_category in CATEGORIES
    assert set(CATEGORIES) == {"delivery", "delivery_solo", "instore", "instore_solo", "delivery_zh",
                               "delivery_zh_solo"}
    two = bench.load_tasks("instore", "all", 2, 1)
    assert [t.uid for t in two] == ["vitabench/instore/10826012", "vitabench/instore/10826017"]
    assert isinstance(bench.make_env(), Environment)
    assert bench.is_error("Error: order x not found") and not bench.is_error("No delivery orders available")
    assert (data_dir() / "LICENSE").read_text().startswith("MIT License")


def test_delivery_tools_follow_the_spec():
    task, env = _episode("delivery", "10711001")
    assert [t["function"]["name"] for t in task.tools][:2] == ["delivery_distance_to_time", "get_delivery_store_info"]
    assert len(task.tools) == 20
    assert _run(env, "delivery_distance_to_time", distance=1500).content == '"35.0"'
    assert _run(env, "longitude_latitude_to_distance", longitude1=102.713518, latitude1=25.048244,
                longitude2=102.70636, latitude2=25.055897).content == '"1115.0"'
    full = task.payload["task"]["environment"]["location"][0]["address"]
    assert _run(env, "address_to_longitude_latitude", address=full).content == '["102.713518", "25.048244"]'
    stores = _run(env, "delivery_store_search_recommand", keywords=["rice", "noodle"]).content
    assert stores.startswith("Store(name=Jintugo") and "score=5.0" in stores
    store, product = "S85277471199200385_S98778", "S26110520013660896_P88296"
    base = {"user_id": "U000001", "store_id": store, "product_ids": [product], "product_cnts": [2],
            "address": full, "dispatch_time": "2025-06-21 11:30:00"}
    # failure cases, soft (no error flag) then hard (`Error: `), and nothing is written by any of them
    wrong_user = _run(env, "create_delivery_order", **{**base, "user_id": "U000002"})
    past = _run(env, "create_delivery_order", **{**base, "dispatch_time": "2025-06-21 11:00:00"})
    no_seconds = _run(env, "create_delivery_order", **{**base, "dispatch_time": "2025-06-21 11:30"})
    assert not (wrong_user.is_error or past.is_error or no_seconds.is_error)
    unknown = _run(env, "create_delivery_order", **{**base, "product_ids": ["nope"]})
    assert unknown.is_error and unknown.content == "Error: nope not found"
    nowhere = _run(env, "create_delivery_order", **{**base, "address": "Shida South Road"})
    assert nowhere.is_error and nowhere.content.startswith("Error: No longitude and latitude")
    assert env.db.orders == {}
    order = _run(env, "create_delivery_order", **base, attributes=["Mild"], note="no chili")
    assert order.content.startswith("Order(order_id:OT") and "shipping_time:32.0" in order.content
    assert "delivery_time:2025-06-21 12:02:00, total_price:50.0" in order.content and "status:unpaid" in order.content
    order_id = _created_id(order.content, "order_id:")
    # the ordered copy replaces the registry entry; the store still shows its own product
    assert "attributes=Mild, quantity=2" in _run(env, "get_delivery_product_info", product_id=product).content
    assert "quantity=0" in _run(env, "get_delivery_store_info", store_id=store).content
    assert _run(env, "search_delivery_orders", user_id="U000001").content.endswith("status:unpaid, ")
    assert _run(env, "pay_delivery_order", order_id=order_id).content == "Payment successful"
    assert not _run(env, "pay_delivery_order", order_id=order_id).is_error  # soft: not unpaid
    assert _run(env, "get_delivery_order_status", order_id=order_id).content == "paid"
    assert _run(env, "cancel_delivery_order", order_id=order_id).content == f"Order {order_id} has been cancelled."
    again = _run(env, "cancel_delivery_order", order_id=order_id)
    assert "already cancelled" in again.content and not again.is_error
    assert _run(env, "get_delivery_order_detail", order_id="zzz").content == "Error: order zzz not found"
    assert env.db.orders[order_id].update_time == task.payload["task"]["environment"]["time"]


def test_instore_tools_follow_the_spec():
    task, env = _episode("instore", "10826017")
    assert len(task.tools) == 24
    user, shop, product = "U955818", "S17564420327514686_I00001", "S17564420327514686_P00001"
    shops = _run(env, "instore_shop_search_recommend", keywords=["massage"]).content.splitlines()
    assert len(shops) == len(env.db.shops) and shops[0].startswith("Shop(shop_name=")
    first = _run(env, "create_instore_product_order", user_id=user, shop_id=shop, product_id=product, quantity=2)
    assert "total_price:316.0" in first.content and first.content.startswith("Order(order_id:OI")
    second = _run(env, "create_instore_product_order", user_id=user, shop_id=shop, product_id=product)
    first_id = _created_id(first.content, "order_id:")
    # the product object is shared: the first order now shows the later quantity, its total unchanged
    shown = [line for line in _run(env, "get_instore_orders", user_id=user).content.splitlines() if first_id in line]
    assert "total_price:316.0" in shown[0] and "quantity=1" in shown[0] and "quantity=2" not in shown[0]
    elsewhere = _run(env, "create_instore_product_order", user_id=user, shop_id=shop,
                     product_id="S17564420327514686_P00011")
    assert "not found in shop" in elsewhere.content and not elsewhere.is_error
    assert _run(env, "pay_instore_order", order_id=first_id).content == "Payment successful"
    assert _run(env, "instore_cancel_order", order_id=first_id).content == f"Order {first_id} is cancelled."
    assert _run(env, "pay_instore_order", order_id="OInothing").is_error
    no_tables = _run(env, "instore_book", user_id=user, shop_id=shop, time="2025-04-12 17:00:00", customer_count=2)
    assert "does not accept" in no_tables.content and not no_tables.is_error and env.db.books == {}
    assert _run(env, "pay_instore_book", book_id="OIx").content == "Error: BookInfo OIx not found"
    booked = _run(env, "instore_reservation", user_id=user, shop_id=shop, time="2025-04-13 17:00:00")
    assert booked.content.startswith("ReservationInfo(reservation_id=OI") and booked.content.endswith("unconsumed")
    reservation = _created_id(booked.content, "reservation_id=")
    moved = _run(env, "instore_modify_reservation", reservation_id=reservation, time="2025-04-14 17:00:00")
    assert "reservation_time=2025-04-14 17:00:00" in moved.content and "customer_count=0" in moved.content
    assert _run(env, "instore_cancel_reservation", reservation_id=reservation).content.endswith("is cancelled.")
    assert "already cancelled" in _run(env, "instore_modify_reservation", reservation_id=reservation,
                                       time="2025-04-14 17:00:00").content
    assert second.content != first.content and len(env.db.orders) == 3


def test_shared_tools_and_base_class_validation():
    _, env = _episode("instore_solo", "10826017")
    rainy = _run(env, "weather", address="Changsha", date_start="2025-04-11", date_end="2025-04-12").content
    assert rainy.splitlines()[1] == ("city: Changsha, weather: moderate rain, datetime: 2025-04-12, "
                                     "temperature: 16.0~22.0, humidity: 78.0")
    assert "Invalid date format" in _run(env, "weather", address="Changsha", date_start="2025/04/11",
                                         date_end="2025-04-12").content
    assert _run(env, "get_holiday_date", year="2025", holiday_name="Dragon Boat").content == "2025-05-31"
    assert _run(env, "get_date_holiday_info", date="2025-10-01").content == "National Day"
    assert "Changsha" in _run(env, "get_user_historical_behaviors").content
    # as upstream, no schema check before a tool runs: a call the tool cannot take fails in it
    extra = _run(env, "get_user_all_orders", user_id="U955818")
    assert extra.dispatched and extra.error_kind == "EXECUTION_ERROR" and extra.content.startswith("Error: ")
    assert _run(env, "get_holiday_date", year=2025, holiday_name="Dragon Boat").content == \
        "No holiday data for the year 2025."
    assert _run(env, "create_delivery_order").error_kind == "TOOL_NOT_AVAILABLE"
    assert env.db.orders.keys() == load_task("instore", "10826017").payload["task"]["environment"]["orders"].keys()


def test_gold_replay_passes_on_a_subset_and_is_deterministic():
    for category, task_id in [("delivery", "10711001"), ("delivery", "30711008"), ("delivery", "80716002"),
                              ("instore", "10826017"), ("instore", "10826007"), ("instore_solo", "10826129"),
                              ("delivery_zh", "10711001")]:
        task = load_task(category, task_id)
        verdict = replay_score(task)
        assert verdict.success and verdict.value == 1.0, (task.uid, verdict.detail)
        assert CAVEAT in verdict.detail and verdict.subscores["required_matched"] == 1.0
        again = load_task(category, task_id)  # same calls, same ids, same results
        assert [r.result.content for r in again.reference[0]] == [r.result.content for r in task.reference[0]]


def test_dropping_the_last_state_changing_gold_call_fails():
    for category, task_id in [("delivery", "10711001"), ("instore", "10826017"), ("instore", "10826129")]:
        task = load_task(category, task_id)
        calls = [r.call for r in task.reference[0]]
        last = max(i for i, c in enumerate(calls) if c.name in CREATES or "cancel" in c.name)
        verdict = VitaBenchEnv().score(task, _steps(calls[:last] + calls[last + 1:]))
        assert not verdict.success and "missing" in verdict.detail and verdict.value < 1.0, task.uid
    task = load_task("delivery", "10711001")
    assert not VitaBenchEnv().score(task, [[]]).success
    cut = VitaBenchEnv().score(task, _steps([r.call for r in task.reference[0]]), termination="step_limit")
    assert not cut.success and "step_limit" in cut.detail


def test_stray_orders_fail_unless_cancelled():
    task = load_task("delivery", "10711001")
    calls = [r.call for r in task.reference[0]]
    create = calls[0]
    assert create.name == "create_delivery_order"
    stray = VitaBenchEnv().score(task, _steps(calls + [create]))
    assert not stray.success and "stray" in stray.detail and stray.subscores["no_strays"] == 0.0
    env = VitaBenchEnv()
    env.reset(task)
    for call in calls:
        env.execute(call)
    extra_id = _created_id(env.execute(create).content, "order_id:")
    cancel = ToolCall("cancel_delivery_order", {"order_id": extra_id})
    assert VitaBenchEnv().score(task, _steps(calls + [create, cancel])).success


def test_a_reasonable_agent_passes_where_gold_ids_are_odd():
    """30711008 swaps a pre-existing order's id with a new one's; 80716002 changes a pre-existing order's product.
    Cancelling the old order and placing the new one passes both (§7's fallback and swapped-id rules)."""
    task, env = _episode("delivery", "30711008")
    old, new = "30711008O01", task.payload["required_orders"][1]
    calls = [ToolCall("cancel_delivery_order", {"order_id": old})]
    order = ToolCall("create_delivery_order", {
        "user_id": "U000037", "store_id": new["store_id"], "product_ids": [p["product_id"] for p in new["products"]],
        "product_cnts": [1], "address": new["location"]["address"], "dispatch_time": env.db.time})
    calls += [order, ToolCall("pay_delivery_order", {"order_id": _created_id(env.execute(order).content, "order_id:")})]
    assert VitaBenchEnv().score(task, _steps(calls)).success
    assert not VitaBenchEnv().score(task, _steps(calls[1:])).success  # the old order left active is wrong
    task, env = _episode("delivery", "80716002")
    calls = [ToolCall("cancel_delivery_order", {"order_id": "80716002T01"})]
    for gold in task.payload["required_orders"]:
        create = ToolCall("create_delivery_order", {
            "user_id": "U000069", "store_id": gold["store_id"], "address": gold["location"]["address"],
            "product_ids": [p["product_id"] for p in gold["products"]], "dispatch_time": gold["dispatch_time"],
            "product_cnts": [p["quantity"] for p in gold["products"]]})
        calls.append(create)
    assert VitaBenchEnv().score(task, _steps(calls)).success


def test_every_gold_replay_through_the_generic_check():
    """What `envace check-env vitabench` does, for the three task files: the only failures are the documented
    defects of the data, each with its reason, and the negative control falls wherever it can."""
    bench = registry.get("vitabench")
    for category, expected in [("delivery", 98), ("instore", 97), ("delivery_zh", 98)]:
        checked = check_category(bench, category, workers=1)
        unreachable = UNREACHABLE["instore" if category == "instore" else "delivery"]
        assert (len(checked.tasks) - len(checked.failures), len(checked.tasks)) == (expected, 100)
        assert {uid.rsplit("/", 1)[1] for uid in checked.failures} == unreachable
        assert problems(checked, bench.known_defects) == [] and not checked.rejected
        assert len(known_failures(checked, bench.known_defects)) == len(unreachable)
        assert len(checked.control("fell")) > 0
    assert {uid.rsplit("/", 1)[1] for uid in KNOWN_DEFECTS if "/instore_solo/" in uid} == UNREACHABLE["instore"]
    details = {t.uid.rsplit("/", 1)[1]: t.detail for t in check_category(bench, "instore_solo", workers=1).tasks}
    assert "booking" in details["10826031"] and "missing" in details["10826019"]


def test_splits_are_by_persona_disjoint_stable_and_about_a_quarter():
    for category, n_test in [("delivery", 26), ("instore", 29), ("delivery_zh", 26)]:
        train, test = load_tasks(category, "train"), load_tasks(category, "test")
        assert (len(train), len(test)) == (100 - n_test, n_test)
        assert not {t.group for t in train} & {t.group for t in test}
        assert not {t.uid for t in train} & {t.uid for t in test}
        assert all(t.split == "test" for t in test) and all(t.group.startswith("vitabench/") for t in test)
        by_group = {}
        for t in train + test:
            assert by_group.setdefault(t.group, t.scenario) == t.scenario
    english = {t.payload["task_id"]: t.split for t in load_tasks("delivery", "all")}
    assert english == {t.payload["task_id"]: t.split for t in load_tasks("delivery_zh_solo", "all")}
    assert [t.payload["task_id"] for t in load_tasks("delivery", "test", 3)] == ["10721001", "20715002", "30711004"]


def test_solo_has_no_user_and_conversations_have_one():
    solo, duo = load_task("delivery_solo", "10711001"), load_task("delivery", "10711001")
    assert solo.simulated_user is None and duo.simulated_user is not None
    assert solo.user_turns == duo.user_turns and "mild rice noodles" in solo.user_turns[0]
    assert "U000001" in solo.user_turns[0] and "2025-06-21 11:20:00 (Saturday)" in solo.system_prompt
    assert "no live user" in solo.system_prompt and "no live user" not in duo.system_prompt
    simulated = duo.simulated_user
    assert simulated.greeting == GREETING and simulated.stopped("Great, thanks. ###STOP###")
    assert not simulated.stopped("Thanks") and simulated.tools == []
    assert "mild rice noodles" in simulated.system_prompt and "U000001" in simulated.system_prompt
    with pytest.raises(ValueError):
        user_system_prompt(solo)
    zh = load_task("delivery_zh", "10711001")
    assert "米线" in zh.simulated_user.system_prompt and "Chinese" in zh.system_prompt
    assert zh.tools != duo.tools and [t["function"]["name"] for t in zh.tools] == [t["function"]["name"]
                                                                                  for t in duo.tools]


def test_unknown_names_and_malformed_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="unknown VitaBench category 'ota'"):
        load_tasks("ota")
    with pytest.raises(UsageError, match="unknown split"):
        load_tasks("delivery", "dev")
    with pytest.raises(UsageError, match="unknown VitaBench instore task id '1'"):
        load_task("instore", "1")
    path = tmp_path / "tasks.json.gz"
    for content, problem in [({"id": "1"}, "expected a JSON list"), ([{"id": "1"}], "task 0 has no str 'instructions'"),
                             ([{"id": "1", "instructions": "x", "environment": {"time": "t", "user_id": "u"},
                                "evaluation_criteria": {}, "user_scenario": {}}], "environment.stores")]:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump(content, fh)
        with pytest.raises(UsageError, match=problem) as caught:
            read_tasks(path, "delivery")
        assert str(path) in str(caught.value)
    path.write_text("not gzip")
    with pytest.raises(UsageError, match="not a gzip-compressed JSON"):
        read_tasks(path, "delivery")
    schema = tmp_path / "tools.json"
    schema.write_text('{"name": "x"}')
    with pytest.raises(UsageError, match="tools.json"):
        read_schemas(schema)
