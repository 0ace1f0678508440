"""Sequence abuse: each class's attack is caught, its named hard negatives stay quiet."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import orjson
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.sequence import WORKFLOWS_FILE, load_workflows
from toolwatch.detectors.tools import annotate, role_of

from tests.fixtures import traffic_sequence as seq
from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

T = T0 + timedelta(hours=3)


def base(seed: int = 1) -> Traffic:
    tr = Traffic(seed=seed)
    tr.background(days=2, users=30, per_day=2)
    return tr


def run(tr: Traffic, **cfg: object) -> detectors.DetectResult:
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict(cfg))


def cats(res: detectors.DetectResult, session: str) -> dict[str, dict]:
    a = res.alerts.filter(pl.col("session_id") == session)
    return {r["category"]: r for r in a.iter_rows(named=True)}


def evidence(alert: dict) -> dict:
    return orjson.loads(alert["evidence"])


@pytest.fixture(scope="module")
def scenario() -> detectors.DetectResult:
    tr = base()
    seq.tool_loop(tr, "loop-1", T, n=40)
    seq.tool_loop(tr, "loop-2", T, n=40, cycle=2, caller="cycler")
    seq.polling_with_backoff(tr, "poll", T)
    seq.retries_of_failed_call(tr, "retry", T)
    seq.privilege_chain(tr, "priv", T)
    seq.editor_own_docs(tr, "editor", T)
    seq.own_folder_writes(tr, "filer", T)
    seq.order_flow(tr, "skip", T, "ord-1", caller="skipper", charge=False)
    seq.order_flow(tr, "shop", T, "ord-2")
    # A failed charge retried (one execution), then fulfilled: no skip, no duplicate.
    tr.call("failed-charge", T - timedelta(seconds=30), "chargePayment", caller="unlucky",
            server="shop-server", resource_key="orderId", resource_id="ord-3", status="error")
    seq.order_flow(tr, "failed-charge", T, "ord-3", caller="unlucky")
    seq.approval_flow(tr, "approve-skip", T, "inv-9", caller="rubberstamp", review=False)
    seq.approval_flow(tr, "approve-ok", T, "inv-8")
    seq.double_charge(tr, "dup", T, "ord-4")
    seq.double_charge(tr, "dup-keys", T, "ord-5", caller="keys", keys=("k-1", "k-2"))
    seq.double_charge(tr, "replay", T, "ord-6", caller="replayer", keys=("k-7", "k-7", "k-7"))
    seq.exfil_flow(tr, "exfil-src", T, sid_out="exfil-out")
    seq.crm_round_trip(tr, "crm", T)
    seq.own_small_upload(tr, "upload", T)
    return run(tr, step_skip={"workflows": POLICY})


#: This deployment's declared workflows: the shipped defaults (fulfil / ship after payment)
#: plus its own "approve after review" rule, which toolwatch does not ship (no seed
#: states it; docs/detectors.md).
POLICY = [
    {"step": "verb:fulfill", "requires": ["verb:charge", "verb:pay", "verb:capture"]},
    {"step": "verb:approve", "requires": ["verb:review"]},
]


def test_undeclared_approval_rule_is_not_a_default() -> None:
    """Approving without a review is a finding only where a deployment declares that rule."""
    tr = base()
    seq.approval_flow(tr, "approve-skip", T, "inv-9", caller="rubberstamp", review=False)
    assert "step_skip" not in cats(run(tr), "approve-skip")


@pytest.mark.parametrize(("session", "category"), [
    ("loop-1", "tool_loop"), ("loop-2", "tool_loop"), ("priv", "privilege_chain"),
    ("skip", "step_skip"), ("approve-skip", "step_skip"), ("dup", "duplicate_execution"),
    ("dup-keys", "duplicate_execution"), ("exfil-out", "cross_server_flow"),
    ("exfil-src", "cross_server_flow"),
])
def test_attack_is_caught_with_chain_evidence(
    scenario: detectors.DetectResult, session: str, category: str
) -> None:
    found = cats(scenario, session)
    assert category in found, (session, {c: a["reasons"] for c, a in found.items()})
    a = found[category]
    assert any(ch.isdigit() for ch in a["reasons"][0])
    chain = evidence(a)["chain"]
    assert chain and all({"tool", "time", "outcome"} <= set(c) for c in chain)
    times = [c["time"] for c in chain]
    assert times == sorted(times)


@pytest.mark.parametrize("session", [
    "poll", "retry", "editor", "filer", "shop", "failed-charge", "approve-ok", "replay", "crm",
    "upload",
])
def test_hard_negative_is_quiet(scenario: detectors.DetectResult, session: str) -> None:
    found = cats(scenario, session)
    assert not found, {c: a["reasons"] for c, a in found.items()}


def test_population_stays_quiet(scenario: detectors.DetectResult) -> None:
    bg = scenario.alerts.filter(pl.col("session_id").str.starts_with("bg-"))
    assert bg.height == 0, bg.select("category", "reasons").to_dicts()


def test_step_skip_names_key_and_missing_step(scenario: detectors.DetectResult) -> None:
    a = cats(scenario, "skip")["step_skip"]
    assert "fulfillOrder succeeded for ord-1" in a["reasons"][0]
    ev = evidence(a)
    assert ev["business_key"] == "ord-1" and ev["rule_source"] == "declared"
    assert [c["tool"] for c in ev["chain"]] == ["createOrder", "fulfillOrder"]


def test_duplicate_counts_executions(scenario: detectors.DetectResult) -> None:
    assert evidence(cats(scenario, "dup")["duplicate_execution"])["executions"] == 2
    ev = evidence(cats(scenario, "dup-keys")["duplicate_execution"])
    assert ev["distinct_idempotency_keys"] == 2


def test_declared_workflow_from_config() -> None:
    tr = base()
    for sid, pay, seat in (("a", True, "s-1"), ("b", False, "s-2")):
        tr.call(sid, T, "reserveSeat", caller=sid, resource_key="seatId", resource_id=seat)
        if pay:
            tr.call(sid, T + timedelta(seconds=5), "holdSeat", caller=sid,
                    resource_key="seatId", resource_id=seat)
        tr.call(sid, T + timedelta(seconds=9), "issueTicket", caller=sid,
                resource_key="seatId", resource_id=seat)
    # The box office issues the ticket for a seat another caller held: the seat's state is
    # what the workflow needs.
    tr.call("office", T + timedelta(seconds=30), "issueTicket", caller="office",
            resource_key="seatId", resource_id="s-1")
    rule = {"workflows": [{"step": "issueTicket", "requires": ["holdSeat"]}]}
    roles = {"roles": {"issueTicket": "irreversible"}}
    res = run(tr, step_skip=rule, tools=roles)
    assert "step_skip" in cats(res, "b") and not cats(res, "a") and not cats(res, "office")
    own = run(tr, step_skip={**rule, "prerequisite_any_caller": False}, tools=roles)
    assert "step_skip" in cats(own, "office")


def test_train_saves_learned_workflows(tmp_path: Path) -> None:
    tr = base()
    for k in range(25):
        sid = f"w-{k}"
        tr.call(sid, T + timedelta(minutes=k), "draftInvoice", caller=f"c{k}",
                resource_key="invoiceId", resource_id=f"inv-{k}")
        tr.call(sid, T + timedelta(minutes=k, seconds=30), "finalizeInvoice", caller=f"c{k}",
                resource_key="invoiceId", resource_id=f"inv-{k}")
    tr.background(days=2, users=120, per_day=2)  # enough sessions for the forest
    model = tmp_path / "models" / "forest.skops"
    info = detectors.train(tr.events(), tr.summaries(), DetectorsConfig(), model)
    learned = load_workflows(tmp_path / "models" / WORKFLOWS_FILE)
    assert info["workflow_rules"] == len(learned)
    assert {"step": "finalizeInvoice", "server": "docs-server", "requires": ["draftInvoice"],
            "support": 25, "confidence": 1.0} in learned
    # A later skip of the learned step alerts at the learned (lower) score — on the server
    # the workflow was learned on only: another server's finalizeInvoice, whose workflow
    # was never observed, is not held to it.
    bad = Traffic(seed=9)
    bad.call("skipper", T, "finalizeInvoice", caller="x", resource_key="invoiceId",
             resource_id="inv-999")
    bad.call("elsewhere", T, "finalizeInvoice", caller="y", server="billing-server",
             resource_key="invoiceId", resource_id="inv-998")
    res = detectors.detect(bad.events(), None, DetectorsConfig(), model_path=model)
    a = cats(res, "skipper")["step_skip"]
    assert evidence(a)["rule_source"] == "learned"
    assert a["score"] == pytest.approx(DetectorsConfig().step_skip.learned_score)
    assert "step_skip" not in cats(res, "elsewhere")
    # A model saved before rules were per server (no "server") holds on every server.
    path = tmp_path / "models" / WORKFLOWS_FILE
    doc = orjson.loads(path.read_bytes())
    for r in doc["rules"]:
        r.pop("server")
    path.write_bytes(orjson.dumps(doc))
    res = detectors.detect(bad.events(), None, DetectorsConfig(), model_path=model)
    assert "step_skip" in cats(res, "elsewhere")


@pytest.mark.slow  # live vs batch over generated traffic
def test_live_matches_batch() -> None:
    tr = base()
    seq.double_charge(tr, "dup", T, "ord-4")
    seq.tool_loop(tr, "loop", T, n=30)
    ev = tr.events().sort("ts")
    live = detectors.StreamDetector.from_config(DetectorsConfig())
    got = [live.update(ev[i:i + 50]) for i in range(0, ev.height, 50)]
    live_ids = set(pl.concat(got)["alert_id"].to_list())
    batch = detectors.run_batch(ev, None, DetectorsConfig())
    want = set(batch.filter(pl.col("category").is_in(["duplicate_execution", "tool_loop"]))
               ["alert_id"].to_list())
    assert want and want <= live_ids


def test_tool_roles() -> None:
    assert role_of("fulfillOrder") == "irreversible"
    assert role_of("applyCoupon") == "irreversible"
    assert role_of("listDocuments") == "list_search"
    assert role_of("uploadFile") == "outbound"
    assert role_of("grantRole") == "admin_exec"
    assert role_of("updateDocument") == "write"
    assert role_of("getPaymentStatus") == "read"
    # One word, not the verb "check": a checkout places the order.
    assert role_of("checkout") == "irreversible" and role_of("checkStatus") == "read"
    cfg = DetectorsConfig.from_dict({"tools": {"roles": {"shop/getX": "irreversible"}}})
    assert role_of("getX", "shop", cfg.tools) == "irreversible"
    assert role_of("getX", "other", cfg.tools) == "read"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=30), st.text(max_size=60)), min_size=1,
                max_size=20))
def test_annotate_survives_hostile_tools_and_args(rows: list[tuple[str, str]]) -> None:
    ev = pl.DataFrame({"server": ["s"] * len(rows), "tool": [r[0] for r in rows],
                       "args": [r[1] for r in rows]})
    out = annotate(ev, DetectorsConfig.from_dict(
        {"tools": {"business_keys": {r[0]: "k\"ey" for r in rows[:3]}}}))
    assert out.height == ev.height
    assert out["tool"].to_list() == ev["tool"].to_list()


def test_probe_loop_is_quiet_at_any_length() -> None:
    """A scheduled health probe repeating one call on a timer is monitoring (the probe
    rule), however long the timer runs: the same caller's probe running all day (900
    calls at 60 s) is a timer's schedule, not an agent stuck. Without the probe rule it is
    a loop far beyond the caller's own usual streak."""
    tr = base()
    for d in range(3):
        tr.ci_bot(f"probe-{d}", T0 + timedelta(days=d, hours=6), calls=60 + d)
    tr.ci_bot("probe-stuck", T0 + timedelta(days=2, hours=12), calls=900)
    res = run(tr)
    for d in range(3):
        assert "tool_loop" not in cats(res, f"probe-{d}")
    assert "tool_loop" not in cats(res, "probe-stuck")
    a = cats(run(tr, tool_loop={"probe_quiet": False}), "probe-stuck")["tool_loop"]
    assert a["severity"] in ("high", "critical"), a


def test_alert_schema_lists_every_category_and_detector() -> None:
    """docs/alert.schema.json names exactly the categories of detectors/config.py and the
    registered detectors (one definition: the schema follows it)."""
    from toolwatch.detectors.config import CATEGORIES
    from toolwatch.detectors.registry import REGISTRY

    schema = orjson.loads((Path(__file__).resolve().parents[1] / "docs" / "alert.schema.json")
                          .read_bytes())
    assert schema["properties"]["category"]["enum"] == list(CATEGORIES)
    names = [d.name for d in (REGISTRY.values() if isinstance(REGISTRY, dict) else REGISTRY)]
    assert sorted(schema["properties"]["detector"]["enum"]) == sorted(names)


# ------------------------------------------- step_skip rule matching == the polars reference
def _tagged_reference(det: object, ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The matching as it was written with polars filters (two queries per rule)."""
    from toolwatch.detectors.sequence import _matches, _verbs

    tools = _verbs(ev["tool"])
    step_rows, pre_rows = [], []
    for r in det.rules_:  # type: ignore[attr-defined]
        st_ = tools.filter(_matches(r["step"]))
        pr = tools.filter(pl.any_horizontal([_matches(x) for x in r["requires"]]))
        if st_.height == 0:
            continue
        step_rows.append(st_.select("tool", pl.lit(r["id"]).alias("rule"),
                                    pl.lit(r["server"], pl.String).alias("rule_server")))
        if pr.height:
            pre_rows.append(pr.select("tool", pl.lit(r["id"]).alias("rule"),
                                      pl.lit(None, pl.String).alias("rule_server")))
    schema = {"tool": pl.String, "rule": pl.Int32, "rule_server": pl.String}
    cast = [pl.col("rule").cast(pl.Int32)]
    a = pl.concat(step_rows).with_columns(cast) if step_rows else pl.DataFrame(schema=schema)
    b = pl.concat(pre_rows).with_columns(cast) if pre_rows else pl.DataFrame(schema=schema)
    return a, b


_TOOL_NAMES = ["createOrder", "chargePayment", "fulfillOrder", "refundOrder", "getOrder",
               "approveDoc", "publishDoc", "CHARGE_card", "charge", "ship-it", "Ünïcode", ""]
_SPECS = st.one_of(
    st.sampled_from(_TOOL_NAMES),
    st.sampled_from(["verb:create", "verb:charge", "verb:Fulfill", "verb:approve", "verb:",
                     "verb:ship", "verb:ünïcode"]),
    st.text(max_size=6),
)


@settings(max_examples=80, deadline=None)
@given(
    tools=st.lists(st.one_of(st.sampled_from(_TOOL_NAMES), st.none(), st.text(max_size=8)),
                   min_size=0, max_size=25),
    rules=st.lists(st.tuples(_SPECS, st.lists(_SPECS, min_size=1, max_size=3),
                             st.one_of(st.none(), st.sampled_from(["shop", "docs"]))),
                   min_size=0, max_size=6),
)
def test_step_skip_rule_matching_equals_the_polars_reference(
    tools: list[str | None], rules: list[tuple[str, list[str], str | None]],
) -> None:
    from toolwatch.detectors.sequence import StepSkipDetector

    det = StepSkipDetector(DetectorsConfig.from_dict({}))
    det.rules_ = [{"id": i, "step": s, "requires": req, "key": None, "server": srv,
                   "score": 0.9, "source": "declared"} for i, (s, req, srv) in enumerate(rules)]
    ev = pl.DataFrame({"tool": tools}, schema={"tool": pl.String})
    got, ref = det._tagged(ev), _tagged_reference(det, ev)
    # Same rows and types (each call lists the distinct tool names in whatever order
    # unique() gives them, so the two calls are compared sorted).
    for g, r in zip(got, ref, strict=True):
        assert g.schema == r.schema
        assert g.sort(["rule", "tool"]).equals(r.sort(["rule", "tool"]))


# ------------------------------------------------ seed 003's cross-server chain, in records
def test_seed_003_customer_export_to_community_plugin_is_a_flow() -> None:
    """internal.get_customer_export() returns a few thousand customer records (just under
    1 MB); analytics_plugin.upload_dataset sends them to a third party. Bytes alone never
    reached min_bytes: records count, and customer data is sensitive at any size."""
    tr = base()
    tr.call("exp", T, "get_customer_export", caller="agent-7", server="internal",
            nbytes=940_000, rows=3_200)
    tr.call("exp", T + timedelta(seconds=20), "upload_dataset", caller="agent-7",
            server="analytics-plugin", args={"name": "q3"}, nbytes=120)
    # Records without bytes logged: the same chain, counted in rows only.
    tr.call("rows-only", T, "listRecords", caller="agent-8", server="internal",
            nbytes=None, rows=5_000)
    tr.call("rows-only", T + timedelta(seconds=20), "upload_dataset", caller="agent-8",
            server="analytics-plugin", nbytes=None)
    # A support agent reads one customer and emails them from another server: the job.
    tr.call("support", T, "getCustomer", caller="agent-9", server="crm",
            resource_key="customerId", resource_id="c-17", nbytes=3_000, rows=1)
    tr.call("support", T + timedelta(seconds=30), "sendEmail", caller="agent-9",
            server="mail", args={"to": "c17@example.com"}, nbytes=100)
    res = run(tr)
    flow = cats(res, "exp")["cross_server_flow"]
    assert flow["severity"] in ("high", "critical")
    assert any("records" in r for r in flow["reasons"]), flow["reasons"]
    assert evidence(flow)["records_read_elsewhere"] == 3_200
    assert "cross_server_flow" in cats(res, "rows-only")
    assert "cross_server_flow" not in cats(res, "support")


def test_refused_step_skip_is_reported_lower() -> None:
    """Seed 000: fulfillOrder without chargePayment. Refused by the server it is still the
    finding, at a lower severity, and the reason says it was refused."""
    tr = base()
    tr.call("tried", T, "createOrder", caller="m1", server="shop-server",
            resource_key="orderId", resource_id="ord-81")
    tr.call("tried", T + timedelta(seconds=5), "fulfillOrder", caller="m1",
            server="shop-server", resource_key="orderId", resource_id="ord-81",
            status="error")
    tr.call("done", T, "createOrder", caller="m2", server="shop-server",
            resource_key="orderId", resource_id="ord-82")
    tr.call("done", T + timedelta(seconds=5), "fulfillOrder", caller="m2",
            server="shop-server", resource_key="orderId", resource_id="ord-82")
    res = run(tr)
    tried, done = cats(res, "tried")["step_skip"], cats(res, "done")["step_skip"]
    assert tried["score"] < done["score"]
    assert tried["severity"] == "low" and done["severity"] in ("high", "critical")
    assert "refused" in tried["reasons"][0] and evidence(tried)["refused"] is True


def test_treasury_run_is_not_a_duplicate_but_a_replay_is() -> None:
    """Paying several recipients from one account, one after another, is the job; the same
    transfer (same recipient and amount) executed twice is a duplicate."""
    tr = base()
    for k in range(6):
        tr.call("payroll", T + timedelta(seconds=8 * k), "transferFunds", caller="treasury",
                server="finance", resource_key="fromAccount", resource_id="acct-ops",
                args={"toAccount": f"emp-{k}", "amount": 3_000 + 10 * k})
    for k in range(2):
        tr.call("replay", T + timedelta(seconds=8 * k), "transferFunds", caller="agent-x",
                server="finance", resource_key="fromAccount", resource_id="acct-ops",
                args={"toAccount": "emp-9", "amount": 5_000, "requestId": f"r-{k}"})
    res = run(tr)
    assert "duplicate_execution" not in cats(res, "payroll")
    assert "step_skip" not in cats(res, "payroll")
    assert "duplicate_execution" in cats(res, "replay")


def test_planted_write_then_execute_is_a_chain_but_a_developer_edit_is_not() -> None:
    """Seed 003's read-enumerate-write where what was read is ordinary: a config read,
    a write planting an admin switch, then a service restart, target after target. A
    developer reading, editing and testing the same kind of file is not a chain."""
    tr = base()
    t = T
    for app in ("billing", "portal"):
        path = {"path": f"/srv/{app}/config.yaml"}
        for tool, args in (("readFile", path),
                           ("writeFile", {**path, "content": "debug: true\nadmin_bypass: true"}),
                           ("executeCommand", {"command": f"systemctl restart {app}"})):
            tr.call("planted", t, tool, caller="m3", server="files", args=args)
            t += timedelta(seconds=2)
    t = T
    for tool, args in (("readFile", {"path": "/home/dev/app/config.yaml"}),
                       ("writeFile", {"path": "/home/dev/app/config.yaml",
                                      "content": "timeout: 30\nretries: 3"}),
                       ("executeCommand", {"command": "pytest -q"})):
        tr.call("dev", t, tool, caller="d1", server="files", args=args)
        t += timedelta(seconds=20)
    res = run(tr)
    chain = cats(res, "planted")["privilege_chain"]
    assert chain["severity"] in ("high", "critical"), chain
    assert chain["reasons"][0].startswith("A write naming a sensitive place or right (writeFile)")
    assert evidence(chain)["planted_execs"] == 2
    assert "privilege_chain" not in cats(res, "dev")


def test_replay_across_reconnections_names_every_session_that_ran_it() -> None:
    """Seed 002: the same charge replayed from new sessions under fresh idempotency keys.
    Each session runs it once; the finding covers all of them, the first included."""
    tr = base()
    for k in range(3):
        tr.call(f"replay-{k}", T + timedelta(minutes=4 * k), "chargePayment", caller="agent-y",
                server="billing", resource_key="orderId", resource_id="ord-77",
                args={"orderId": "ord-77", "amountCents": 4_200, "idempotencyKey": f"k-{k}"})
    res = run(tr)
    for k in range(3):
        dup = cats(res, f"replay-{k}")["duplicate_execution"]
        assert evidence(dup)["executions"] == 3, dup


def _docs_then_mail(tr: Traffic, sid: str, caller: str, to: str, attach: bool) -> None:
    for k in range(6):
        tr.call(sid, T + timedelta(seconds=k), "getDocument", caller=caller, server="docs",
                resource_key="documentId", resource_id=f"doc-{k}", nbytes=5_000, rows=1)
    args: dict[str, object] = {"to": to, "subject": "docs"}
    if attach:
        args["attachments"] = 6
    tr.call(sid, T + timedelta(seconds=10), "sendEmail", caller=caller, server="mail",
            args=args, nbytes=200)



def test_a_payout_after_reading_customers_is_not_a_flow_a_post_is() -> None:
    """A finance user reads 1.7 MB of customer records, then pays a supplier: sendPayout is
    outbound by its verb but sends a recipient and an amount, not data. The same reads
    then posted to another server's outbound tool are a flow."""
    tr = base()
    for sid, caller, out, args in (
            ("pay", "fin-1", "sendPayout", {"recipientId": "acct-9", "amountCents": 120_000}),
            ("post", "fin-2", "postMessage", {"channel": "ext-partners", "text": "see list"})):
        for k in range(3):
            tr.call(sid, T + timedelta(seconds=20 * k), "get_customer_export", caller=caller,
                    server="crm", args={"segment": f"s{k}"}, nbytes=580_000, rows=100)
        tr.call(sid, T + timedelta(minutes=5), out, caller=caller, server="payments"
                if out == "sendPayout" else "chat", args=args)
    res = run(tr)
    assert "cross_server_flow" not in cats(res, "pay")
    assert "cross_server_flow" in cats(res, "post")

def test_documents_mailed_to_an_address_outside_the_usual_domains_are_a_flow() -> None:
    """Internal documents attached to a mail to a personal domain: small, but carried to a
    destination almost none of the mail goes to. The same attachments to the
    organisation's own domain, or a plain mail to the rare domain, are work."""
    tr = base()
    for n in range(12):  # the organisation's mail: many accounts, its own domain
        tr.call(f"m{n}", T + timedelta(minutes=n), "sendEmail", caller=f"staff-{n}",
                server="mail", args={"to": f"team{n}@corp.example", "subject": "hi"})
    _docs_then_mail(tr, "leak", "mallory", "drop@gmail.com", attach=True)
    _docs_then_mail(tr, "own", "bob", "ops@corp.example", attach=True)
    _docs_then_mail(tr, "plain", "carol", "friend@gmail.com", attach=False)
    res = run(tr)
    flow = cats(res, "leak")["cross_server_flow"]
    assert evidence(flow)["destination"] == "gmail.com"
    assert evidence(flow)["rare_destination"] is True
    assert "cross_server_flow" not in cats(res, "own")
    assert "cross_server_flow" not in cats(res, "plain")
    quiet = run(tr, cross_server_flow={"rare_dest_callers": 0, "rare_dest_share": 0.0})
    assert "cross_server_flow" not in cats(quiet, "leak")


def test_a_customer_record_pasted_into_a_plugin_nobody_uses_is_a_flow() -> None:
    """Seed 003: a trusted server's customer record handed to a community plugin. The
    plugin's summarizer is not an outbound verb; the record in its text argument is."""
    tr = base()
    tr.call("pii", T, "get_customer", caller="agent-3", server="internal",
            resource_key="customerId", resource_id="cus_1", nbytes=2_000, rows=1)
    tr.call("pii", T + timedelta(seconds=3), "summarize_text", caller="agent-3",
            server="analytics-plugin", args={"text": "[customer record]"}, nbytes=900)
    # Notes of one's own, summarized by the same plugin: no records of people read.
    tr.call("notes", T, "readFile", caller="dev-1", server="files",
            args={"path": "/home/dev-1/notes.md"}, nbytes=2_000, rows=1)
    tr.call("notes", T + timedelta(seconds=3), "summarize_text", caller="dev-1",
            server="analytics-plugin", args={"text": "notes"}, nbytes=900)
    res = run(tr)
    assert evidence(cats(res, "pii")["cross_server_flow"])["record_reads"] == 1
    assert "cross_server_flow" not in cats(res, "notes")


def test_checkout_whose_order_is_fulfilled_unpaid_from_another_session_is_named() -> None:
    """The checkout logs no order id; the caller fulfils the order from a second session
    without paying. Only the caller ties them: its unpaid checkout carries the skip too,
    a checkout it paid for does not."""
    tr = base()
    for sid, paid in (("ck-a", False), ("ck-b", True)):
        caller = f"cust-{sid}"
        tr.call(sid, T, "createCart", caller=caller, server="shop")
        tr.call(sid, T + timedelta(seconds=20), "checkout", caller=caller, server="shop",
                args={"cartId": f"cart-{sid}"})
        if paid:
            tr.call(sid, T + timedelta(seconds=30), "chargePayment", caller=caller,
                    server="shop", args={"cartId": f"cart-{sid}"})
        tr.call(f"{sid}-2", T + timedelta(minutes=5), "fulfillOrder", caller=caller,
                server="shop", resource_key="orderId", resource_id=f"ord-{sid}")
    res = run(tr)
    assert "step_skip" in cats(res, "ck-a-2") and "step_skip" in cats(res, "ck-b-2")
    origin = cats(res, "ck-a")["step_skip"]
    assert evidence(origin)["skipped_step"] == "fulfillOrder"
    assert "step_skip" not in cats(res, "ck-b")
    assert "step_skip" not in cats(run(tr, step_skip={"origin_minutes": 0}), "ck-a")


# ------------------------------------------ duplicate_execution: a replay, not a repeat
def test_payout_sent_twice_is_a_duplicate_but_a_payroll_is_not() -> None:
    """A tool that moves money is irreversible whatever its verb: "sendPayout" is outbound
    by its verb, but the same payout (recipient, amount) sent twice pays twice. A payroll
    paying each recipient once is the job."""
    tr = base()
    for k in range(2):
        tr.call("payout-dup", T + timedelta(seconds=25 * k), "sendPayout", caller="agent-p",
                server="payments", resource_key="recipientId", resource_id="acct-7",
                args={"recipientId": "acct-7", "amountCents": 4_999})
    for k in range(8):
        tr.call("payroll", T + timedelta(seconds=3 * k), "sendPayout", caller="svc-payroll",
                server="payments", resource_key="recipientId", resource_id=f"emp-{k}",
                args={"recipientId": f"emp-{k}", "amountCents": 300_000 + k,
                      "idempotencyKey": f"run-1-emp-{k}"})
    res = run(tr)
    dup = cats(res, "payout-dup")["duplicate_execution"]
    assert evidence(dup)["executions"] == 2 and evidence(dup)["tool"] == "sendPayout"
    assert "duplicate_execution" not in cats(res, "payroll")


def test_same_operation_hours_later_is_a_new_intent_but_a_quick_replay_is_not() -> None:
    """A replay follows within minutes (a retry on ambiguity, a reconnection); approving the
    same expense again half a day later, after reading it afresh in a new session, is
    another step, not one approval executed twice."""
    tr = base()
    for k, at in enumerate((T, T + timedelta(hours=12))):
        sid = f"manager-{k}"
        tr.call(sid, at, "getExpense", caller="mgr", server="expenses",
                resource_key="expenseId", resource_id="exp-5", args={"expenseId": "exp-5"})
        tr.call(sid, at + timedelta(minutes=2), "approveExpense", caller="mgr",
                server="expenses", resource_key="expenseId", resource_id="exp-5",
                args={"expenseId": "exp-5"})
    for k in range(2):
        tr.call("approve-twice", T + timedelta(seconds=8 * k), "approveExpense",
                caller="agent-a", server="expenses", resource_key="expenseId",
                resource_id="exp-6", args={"expenseId": "exp-6"})
    res = run(tr)
    for k in range(2):
        assert "duplicate_execution" not in cats(res, f"manager-{k}")
    assert evidence(cats(res, "approve-twice")["duplicate_execution"])["executions"] == 2



def test_approving_again_after_reading_it_again_is_low_a_replay_is_not() -> None:
    """A manager reads an expense and approves it, then minutes later reads it again and
    approves it again: the approval ran twice (still reported), but as a second decision
    at a person's pace, not a retry loop's replay, which stays medium or higher."""
    tr = base()
    for k in range(2):
        at = T + timedelta(minutes=6 * k)
        tr.call("mgr-twice", at, "getExpense", caller="mgr", server="expenses",
                resource_key="expenseId", resource_id="exp-9", args={"expenseId": "exp-9"})
        tr.call("mgr-twice", at + timedelta(seconds=40), "approveExpense", caller="mgr",
                server="expenses", resource_key="expenseId", resource_id="exp-9",
                args={"expenseId": "exp-9"})
    tr.call("agent-twice", T, "getExpense", caller="agent-a", server="expenses",
            resource_key="expenseId", resource_id="exp-6", args={"expenseId": "exp-6"})
    for k in range(3):
        tr.call("agent-twice", T + timedelta(seconds=30 + 20 * k), "approveExpense",
                caller="agent-a", server="expenses", resource_key="expenseId",
                resource_id="exp-6", args={"expenseId": "exp-6"})
    res = run(tr)
    mgr = cats(res, "mgr-twice")["duplicate_execution"]
    assert mgr["severity"] == "low" and evidence(mgr)["repeated_after_reread"]
    assert "read the object again" in " ".join(mgr["reasons"])
    agent = cats(res, "agent-twice")["duplicate_execution"]
    assert agent["severity"] in ("high", "critical")
    assert not evidence(agent)["repeated_after_reread"]
    off = run(tr, duplicate_execution={"reread_score": 0})
    assert cats(off, "mgr-twice")["duplicate_execution"]["severity"] != "low"

def test_metered_spends_naming_no_object_are_not_duplicates() -> None:
    """spend_credits(amount, reason) names no order, payment or recipient: a caller running
    several different spends meters its work, and equal spends recur by chance (here two
    in a row, seconds apart). One spend that is all a caller does, repeated at once, is
    still a replay."""
    tr = base()
    menu = [(1, "render"), (5, "ocr"), (1, "render"), (1, "render"), (10, "translate"),
            (2, "ocr"), (5, "ocr"), (1, "render"), (2, "ocr")]
    at = T
    for amount, reason in menu:
        tr.call("metered", at, "spend_credits", caller="rosa", server="billing",
                args={"userId": "rosa", "amount": amount, "reason": reason})
        at += timedelta(seconds=4 if reason == "render" else 140)
    for k in range(3):
        tr.call("respend", T + timedelta(seconds=12 * k), "spend_credits", caller="agent-s",
                server="billing", args={"userId": "agent-s", "amount": 50, "reason": "gpu"})
    res = run(tr)
    assert "duplicate_execution" not in cats(res, "metered")
    assert evidence(cats(res, "respend")["duplicate_execution"])["executions"] == 3
    off = run(tr, duplicate_execution={"metered_min_ops": 0})
    assert "duplicate_execution" in cats(off, "metered")


def test_documents_whose_size_the_upload_states_are_a_flow() -> None:
    """Seed 003: data read on a trusted internal server, passed to a less-trusted plugin.
    A few internal documents (under min_bytes, no records of people) uploaded to a
    plugin every team uses: the upload states the size it carries, and the documents
    read just before add up to it, so the documents themselves left. An aggregate
    uploaded after the same reads (no size stated, or one nothing adds up to) is work."""
    tr = base()
    sizes = [91_000, 140_500, 66_250, 120_000, 88_800]
    for sid, caller, stated in (("docs-out", "agent-d", sum(sizes)),
                                ("agg-out", "analyst-a", None),
                                ("agg-size", "analyst-b", 4_800)):
        for n, b in enumerate(sizes):
            tr.call(sid, T + timedelta(seconds=10 * n), "getDocument", caller=caller,
                    server="docs", resource_key="documentId", resource_id=f"doc-{n}",
                    nbytes=b, rows=1)
        args: dict[str, object] = {"datasetName": "contracts", "records": len(sizes)}
        if stated is not None:
            args["sizeBytes"] = stated
        tr.call(sid, T + timedelta(minutes=2), "upload_dataset", caller=caller,
                server="analytics-plugin", args=args, nbytes=80)
    # The plugin is the organisation's own tool: many callers upload to it.
    for n in range(8):
        tr.call(f"team-{n}", T + timedelta(minutes=n), "upload_dataset",
                caller=f"staff-{n}", server="analytics-plugin",
                args={"datasetName": "kpis", "records": 12}, nbytes=80)
    res = run(tr)
    flow = cats(res, "docs-out")["cross_server_flow"]
    assert evidence(flow)["sent_what_was_read"] is True
    assert any("states the size" in r for r in flow["reasons"]), flow["reasons"]
    assert "cross_server_flow" not in cats(res, "agg-out")
    assert "cross_server_flow" not in cats(res, "agg-size")
    off = run(tr, cross_server_flow={"size_match_tolerance": 0.0})
    assert "cross_server_flow" not in cats(off, "docs-out")


def test_a_stated_upload_size_names_only_the_sessions_it_came_from() -> None:
    """A caller exports customers in one session and uploads them from another; the same
    hour its job poller downloaded several MB of job results in other sessions. The upload
    states the export's size: the export's session carries the flow, the poller's sessions
    (which supplied most of the hour's bytes) do not, and the volume reported is the
    export's."""
    tr = base()
    for n in range(3):
        tr.call(f"poll-{n}", T - timedelta(minutes=40 - 10 * n), "downloadResult",
                caller="ops-bot", server="warehouse", resource_key="jobId",
                resource_id=f"job-{n}", nbytes=3_500_000, rows=20_000)
    tr.call("export", T, "get_customer_export", caller="ops-bot", server="crm",
            nbytes=920_724, rows=2_498)
    tr.call("upload", T + timedelta(seconds=50), "upload_dataset", caller="ops-bot",
            server="analytics-plugin",
            args={"datasetName": "customers", "records": 2_498, "sizeBytes": 920_724},
            nbytes=75)
    res = run(tr)
    for sid in ("export", "upload"):
        flow = cats(res, sid)["cross_server_flow"]
        assert evidence(flow)["bytes_read_elsewhere"] == 920_724
    for n in range(3):
        assert "cross_server_flow" not in cats(res, f"poll-{n}")


def test_a_session_feeding_two_flows_carries_the_one_that_scores() -> None:
    """A customer export uploaded to a plugin, then (with more reads) a report written into
    the caller's own files: the export's session carries the upload, which scores, not the
    larger flow into the report, which does not."""
    tr = base()
    tr.call("gw-1", T, "get_customer_export", caller="agent-x", server="crm",
            nbytes=3_500_000, rows=11_000)
    tr.call("gw-1", T + timedelta(seconds=4), "upload_dataset", caller="agent-x",
            server="analytics-plugin", args={"datasetName": "customers"}, nbytes=75)
    tr.call("work", T + timedelta(minutes=5), "getDocument", caller="agent-x",
            server="docs", resource_key="documentId", resource_id="doc-1", nbytes=600_000)
    tr.call("report", T + timedelta(minutes=9), "create_report", caller="agent-x",
            server="files", args={"content": "<md>"}, nbytes=70)
    flow = cats(run(tr), "gw-1")["cross_server_flow"]
    assert evidence(flow)["outbound_tool"] == "upload_dataset"


def test_expense_paid_without_approval_is_a_step_skip_by_default() -> None:
    """Seed 000 names approveExpense as a step of the expense state machine: an expense is
    paid only once approved (what the approval is for). The default rule is keyed to the
    expense: an expense submitted and paid straight away is a skip, an approved one (by
    anyone: a manager approves, finance pays) is not, and paying an order or an invoice
    (which a customer does without approval) is not constrained by it."""
    tr = base()
    for sid, approved in (("unapproved", False), ("approved", True)):
        key = f"exp-{sid}"
        tr.call(sid, T, "submitExpense", caller=f"emp-{sid}", server="finance",
                resource_key="expenseId", resource_id=key)
        if approved:
            tr.call(f"{sid}-mgr", T + timedelta(minutes=5), "approveExpense",
                    caller="manager", server="finance", resource_key="expenseId",
                    resource_id=key)
        tr.call(f"{sid}-pay", T + timedelta(minutes=9), "payExpense", caller="finance-bot",
                server="finance", resource_key="expenseId", resource_id=key)
    tr.call("customer", T, "payInvoice", caller="cust-1", server="billing",
            resource_key="invoiceId", resource_id="inv-1")
    tr.call("customer", T + timedelta(seconds=20), "pay_order", caller="cust-1",
            server="shop", resource_key="orderId", resource_id="ord-1")
    res = run(tr)
    skip = cats(res, "unapproved-pay")["step_skip"]
    assert evidence(skip)["rule_source"] == "declared"
    assert "approve" in " ".join(skip["reasons"])
    assert "step_skip" not in cats(res, "approved-pay")
    assert not cats(res, "customer")


def test_a_checkout_is_not_the_origin_of_a_skip_unrelated_to_orders() -> None:
    """A customer checks out in one session; forty minutes later, in another
    session, the same account approves an invoice without its declared review. The
    approval is a skip, but it did not come from the purchase: the checkout's session
    stays quiet (only a step missing its payment is tied to the caller's checkouts)."""
    tr = base()
    tr.call("buy", T, "createCart", caller="clerk", server="shop")
    tr.call("buy", T + timedelta(seconds=20), "checkout", caller="clerk", server="shop",
            args={"cartId": "cart-1"})
    tr.call("approve", T + timedelta(minutes=40), "approveInvoice", caller="clerk",
            server="erp", resource_key="invoiceId", resource_id="inv-77")
    res = run(tr, step_skip={"workflows": POLICY})
    assert "step_skip" in cats(res, "approve")
    assert "step_skip" not in cats(res, "buy")
    # Before: every skipped rule was tied to the caller's recent checkouts.
    every = run(tr, step_skip={"workflows": POLICY, "origin_requires": ["verb:review"]})
    assert "step_skip" in cats(every, "buy")


def test_a_stated_upload_size_keeps_the_callers_secret_reads() -> None:
    """The stated size narrows a flow to the reads that make it up, but a read of
    credentials by the same caller in the window is never dropped: a few hundred bytes
    of .env fit within the tolerance of a megabyte, so the size cannot rule it out."""
    tr = base()
    tr.call("secrets", T, "readFile", caller="agent-s", server="files",
            args={"path": "/srv/app/.env"}, nbytes=320, rows=1)
    sizes = [310_000, 290_000, 305_000]
    for n, b in enumerate(sizes):
        tr.call("docs", T + timedelta(seconds=30 + 10 * n), "getDocument", caller="agent-s",
                server="docs", resource_key="documentId", resource_id=f"doc-{n}",
                nbytes=b, rows=1)
    tr.call("up", T + timedelta(minutes=2), "upload_dataset", caller="agent-s",
            server="analytics-plugin",
            args={"datasetName": "bundle", "sizeBytes": sum(sizes)}, nbytes=80)
    res = run(tr)
    assert evidence(cats(res, "up")["cross_server_flow"])["sensitive_reads"] == 1
    assert "cross_server_flow" in cats(res, "secrets")
