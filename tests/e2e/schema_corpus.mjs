// schema_corpus.mjs - JSON Schemas for the structured-output tests: hand-written tool and response
// schemas of the kinds real clients send (weather, search, calendar, files, SQL, e-commerce, ...), and
// a seeded generator that composes the supported keywords into hundreds more. Not a test itself:
// tests/e2e/test_schema_corpus.mjs serves every schema to the demo model and validates the replies
// with ajv.
//
// Every schema here must compile. Strings and arrays are bounded (maxLength / maxItems / enum /
// format / pattern) where a random-weight model would otherwise wander for hundreds of tokens; that
// keeps replies short enough to finish, not to help the grammar.
//
// corpus({ seed }) -> [{ name, schema, expect? }]: expect "refuse:KEYWORD" marks a schema the server
// must refuse with a 400 naming KEYWORD (oneOf whose branches overlap).

const str = (maxLength = 20, extra = {}) => ({ type: "string", maxLength, ...extra });
const int = (minimum, maximum, extra = {}) => ({ type: "integer", ...(minimum !== undefined && { minimum }), ...(maximum !== undefined && { maximum }), ...extra });
const num = (minimum, maximum, extra = {}) => ({ type: "number", ...(minimum !== undefined && { minimum }), ...(maximum !== undefined && { maximum }), ...extra });
const en = (...v) => ({ type: "string", enum: v });
const arr = (items, maxItems = 3, minItems) => ({ type: "array", items, maxItems, ...(minItems !== undefined && { minItems }) });
const obj = (properties, required = Object.keys(properties), additionalProperties) =>
  ({ type: "object", properties, required, ...(additionalProperties !== undefined && { additionalProperties }) });
const bool = { type: "boolean" };
const DATE = { type: "string", format: "date" }, DT = { type: "string", format: "date-time" }, TIME = { type: "string", format: "time" };
const UUID = { type: "string", format: "uuid" }, EMAIL = { type: "string", format: "email" }, IPV4 = { type: "string", format: "ipv4" };

// ---- hand-written: real tool parameter schemas and response formats ----
export const HAND = {
  get_weather: obj({ location: str(30), unit: en("celsius", "fahrenheit") }, ["location"], false),
  get_forecast: obj({ city: str(24), country_code: { type: "string", pattern: "^[A-Z]{2}$" }, days: int(1, 14), hourly: bool }, ["city", "days"]),
  web_search: obj({ query: str(40), max_results: int(1, 20), safe_search: en("off", "moderate", "strict"), recency_days: int(0, 365) }, ["query"]),
  news_search: obj({ topic: str(24), language: en("en", "de", "fr", "es", "ja"), from: DATE, to: DATE, sort: en("relevance", "date") }, ["topic"], false),
  calendar_create_event: obj({ title: str(30), start: DT, end: DT, attendees: arr(EMAIL, 3), location: str(24), all_day: bool,
    reminder_minutes: int(0, 1440) }, ["title", "start", "end"], false),
  calendar_list_events: obj({ date: DATE, calendar_id: str(16), max_events: int(1, 50) }, ["date"]),
  set_reminder: obj({ text: str(30), at: TIME, repeat: en("none", "daily", "weekly", "monthly") }, ["text", "at"]),
  read_file: obj({ path: { type: "string", pattern: "^/[a-z0-9_/.-]{1,40}$" }, offset: int(0), limit: int(1, 10000), encoding: en("utf-8", "latin-1") }, ["path"], false),
  write_file: obj({ path: { type: "string", pattern: "^/[a-z0-9_/.-]{1,40}$" }, content: str(60), append: bool, mode: { type: "string", pattern: "^0[0-7]{3}$" } }, ["path", "content"], false),
  list_directory: obj({ path: str(40), recursive: bool, pattern: str(12), include_hidden: bool }, ["path"]),
  move_file: obj({ source: str(40), destination: str(40), overwrite: bool }, undefined, false),
  delete_files: obj({ paths: arr(str(40), 4, 1), force: bool }, ["paths"], false),
  sql_query: obj({ sql: str(80), database: en("analytics", "users", "orders"), params: arr({ type: ["string", "integer", "number", "boolean", "null"], maxLength: 12 }, 4), timeout_ms: int(100, 60000) }, ["sql", "database"], false),
  sql_insert: obj({ table: { type: "string", pattern: "^[a-z_]{1,20}$" }, rows: arr({ type: "object", additionalProperties: { type: ["string", "number", "null"], maxLength: 10 } }, 3, 1) }, ["table", "rows"]),
  create_order: obj({
    customer_id: UUID,
    items: arr(obj({ sku: { type: "string", pattern: "^[A-Z]{3}-[0-9]{4}$" }, quantity: int(1, 100), unit_price: num(0, 10000) }, ["sku", "quantity"], false), 4, 1),
    shipping: obj({ street: str(30), city: str(20), postal_code: { type: "string", pattern: "^[0-9]{5}$" }, country: en("US", "DE", "FR", "JP") }, undefined, false),
    express: bool, coupon: { anyOf: [str(12), { type: "null" }] },
  }, ["customer_id", "items", "shipping"], false),
  search_products: obj({ keywords: str(30), category: en("books", "electronics", "garden", "toys"), price_min: num(0), price_max: num(0, 100000),
    in_stock: bool, sort_by: en("price_asc", "price_desc", "rating"), page: int(1, 100) }, ["keywords"]),
  refund_request: obj({ order_id: { type: "string", pattern: "^ORD[0-9]{6}$" }, reason: en("damaged", "late", "wrong_item", "other"), amount: num(0, 5000, { exclusiveMinimum: 0 }), note: str(40) }, ["order_id", "reason", "amount"]),
  send_email: obj({ to: arr(EMAIL, 3, 1), cc: arr(EMAIL, 2), subject: str(40), body: str(80), priority: en("low", "normal", "high") }, ["to", "subject", "body"], false),
  slack_post: obj({ channel: { type: "string", pattern: "^#[a-z0-9-]{2,20}$" }, text: str(60), thread_ts: { anyOf: [{ type: "string", pattern: "^[0-9]{10}\\.[0-9]{6}$" }, { type: "null" }] } }, ["channel", "text", "thread_ts"], false),
  translate: obj({ text: str(60), source_lang: en("auto", "en", "de", "fr", "zh"), target_lang: en("en", "de", "fr", "zh"), formality: en("default", "more", "less") }, ["text", "target_lang"]),
  convert_units: obj({ value: num(-1e6, 1e6), from_unit: en("m", "km", "mi", "ft", "kg", "lb"), to_unit: en("m", "km", "mi", "ft", "kg", "lb") }, undefined, false),
  convert_currency: obj({ amount: num(0, 1e9, { exclusiveMinimum: 0 }), from: { type: "string", pattern: "^[A-Z]{3}$" }, to: { type: "string", pattern: "^[A-Z]{3}$" }, date: DATE }, ["amount", "from", "to"]),
  stock_quote: obj({ symbol: { type: "string", pattern: "^[A-Z]{1,5}$" }, exchange: en("NYSE", "NASDAQ", "LSE"), interval: en("1d", "1w", "1m") }, ["symbol"]),
  flight_search: obj({ origin: { type: "string", pattern: "^[A-Z]{3}$" }, destination: { type: "string", pattern: "^[A-Z]{3}$" }, depart: DATE, return: DATE,
    passengers: obj({ adults: int(1, 9), children: int(0, 8), infants: int(0, 4) }, ["adults"], false), cabin: en("economy", "premium", "business", "first"), nonstop: bool }, ["origin", "destination", "depart", "passengers"], false),
  hotel_booking: obj({ hotel_id: str(12), check_in: DATE, nights: int(1, 30), rooms: arr(obj({ guests: int(1, 4), bed: en("single", "double", "twin") }), 3, 1), breakfast: bool }, ["hotel_id", "check_in", "nights", "rooms"]),
  restaurant_reservation: obj({ restaurant: str(24), date: DATE, time: TIME, party_size: int(1, 20), seating: en("indoor", "outdoor", "bar"), notes: str(40) }, ["restaurant", "date", "time", "party_size"], false),
  directions: obj({ origin: str(30), destination: str(30), mode: en("driving", "walking", "bicycling", "transit"), waypoints: arr(str(24), 3), avoid: arr(en("tolls", "highways", "ferries"), 3) }, ["origin", "destination"]),
  geocode: obj({ address: str(40) }, ["address"], false),
  reverse_geocode: obj({ lat: num(-90, 90), lon: num(-180, 180) }, undefined, false),
  http_request: obj({ method: en("GET", "POST", "PUT", "DELETE", "PATCH"), url: { type: "string", pattern: "^https://[a-z0-9.-]{3,30}(/[a-z0-9_-]{0,12}){0,3}$" },
    headers: { type: "object", additionalProperties: str(30) }, body: { anyOf: [str(60), { type: "null" }] }, timeout_s: num(0.1, 120) }, ["method", "url"], false),
  run_code: obj({ language: en("python", "javascript", "bash"), code: str(80), timeout_s: int(1, 60), stdin: str(20) }, ["language", "code"], false),
  git_commit: obj({ message: str(50), files: arr(str(30), 4, 1), amend: bool, author: obj({ name: str(20), email: EMAIL }) }, ["message", "files"]),
  create_ticket: obj({ project: { type: "string", pattern: "^[A-Z]{2,6}$" }, title: str(40), type: en("bug", "task", "story", "epic"), priority: int(1, 5),
    labels: arr(str(12), 3), assignee: { anyOf: [EMAIL, { type: "null" }] }, estimate_hours: num(0, 200) }, ["project", "title", "type"], false),
  update_profile: obj({ user_id: UUID, display_name: str(24, { minLength: 1 }), birthday: DATE, timezone: en("UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"),
    notifications: obj({ email: bool, sms: bool, push: bool }, undefined, false) }, ["user_id"], false),
  firewall_rule: obj({ action: en("allow", "deny"), source: IPV4, destination: IPV4, port: int(1, 65535), protocol: en("tcp", "udp", "icmp") }, ["action", "source", "port"], false),
  math_eval: obj({ expression: str(40), precision: int(0, 15) }, ["expression"]),
  image_generate: obj({ prompt: str(60), size: en("256x256", "512x512", "1024x1024"), n: int(1, 4), style: en("vivid", "natural"), seed: int(0, 4294967295) }, ["prompt"], false),
  log_workout: obj({ activity: en("run", "swim", "bike", "lift"), duration_min: num(1, 600), distance_km: num(0, 300), heart_rate: obj({ avg: int(40, 220), max: int(40, 230) }, ["avg"]), date: DATE }, ["activity", "duration_min", "date"]),
  recipe: obj({ name: str(30), servings: int(1, 12), ingredients: arr(obj({ item: str(20), grams: num(0, 5000) }, ["item"], false), 5, 1), steps: arr(str(50), 4, 1), vegetarian: bool }, ["name", "ingredients", "steps"]),
  invoice: obj({ invoice_no: { type: "string", pattern: "^INV-[0-9]{5}$" }, issued: DATE, due: DATE, currency: en("USD", "EUR"),
    lines: arr(obj({ description: str(30), qty: int(1, 1000), price: num(0, 1e6) }, undefined, false), 4, 1), tax_rate: num(0, 1), paid: bool }, ["invoice_no", "issued", "lines", "currency"], false),
  inventory_adjust: obj({ warehouse: en("north", "south", "east"), sku: str(12), delta: int(-1000, 1000), reason: en("recount", "damage", "return", "sale") }, undefined, false),
  sentiment: obj({ label: en("positive", "neutral", "negative"), score: num(-1, 1), aspects: arr(obj({ aspect: str(16), polarity: en("pos", "neg") }), 3) }, ["label", "score"], false),
  extraction: obj({ people: arr(obj({ name: str(24), age: { anyOf: [int(0, 130), { type: "null" }] }, email: { anyOf: [EMAIL, { type: "null" }] } }, undefined, false), 3), org: { type: ["string", "null"], maxLength: 24 } }, ["people", "org"], false),
  classification: obj({ category: en("billing", "technical", "account", "other"), confidence: num(0, 1, { exclusiveMaximum: 1 }), escalate: bool }, undefined, false),
  answer_with_sources: obj({ answer: str(80), sources: arr(obj({ title: str(30), url: { type: "string", pattern: "^https://[a-z]{3,12}\\.(com|org)/[a-z0-9]{1,10}$" } }), 3, 1), confidence: en("low", "medium", "high") }, undefined, false),
  // discriminated unions, $ref/$defs, recursion
  shape_area: obj({ shape: { oneOf: [
    obj({ kind: { const: "circle" }, radius: num(0, 1000) }, undefined, false),
    obj({ kind: { const: "rect" }, width: num(0, 1000), height: num(0, 1000) }, undefined, false),
    obj({ kind: { const: "triangle" }, a: num(0, 100), b: num(0, 100), c: num(0, 100) }, undefined, false) ] } }, undefined, false),
  json_patch: { type: "array", maxItems: 3, minItems: 1, items: { oneOf: [
    obj({ op: { const: "add" }, path: str(20), value: { type: ["string", "number", "boolean"], maxLength: 10 } }, undefined, false),
    obj({ op: { const: "remove" }, path: str(20) }, undefined, false),
    obj({ op: { const: "move" }, from: str(20), path: str(20) }, undefined, false) ] } },
  payment: obj({ amount_cents: int(1, 10000000), method: { oneOf: [
    obj({ type: { const: "card" }, last4: { type: "string", pattern: "^[0-9]{4}$" }, exp: { type: "string", pattern: "^(0[1-9]|1[0-2])/[0-9]{2}$" } }, undefined, false),
    obj({ type: { const: "iban" }, iban: { type: "string", pattern: "^[A-Z]{2}[0-9]{2}[A-Z0-9]{8,16}$" } }, undefined, false),
    obj({ type: { const: "wallet" }, provider: en("apple", "google") }, undefined, false) ] } }, undefined, false),
  notification: { oneOf: [obj({ channel: { const: "email" }, address: EMAIL }, undefined, false), obj({ channel: { const: "sms" }, phone: { type: "string", pattern: "^\\+[0-9]{8,12}$" } }, undefined, false), { type: "null" }] },
  config_defs: { $defs: { port: int(1, 65535), host: { type: "string", pattern: "^[a-z0-9.-]{1,20}$" }, endpoint: obj({ host: { $ref: "#/$defs/host" }, port: { $ref: "#/$defs/port" }, tls: bool }, ["host", "port"], false) },
    ...obj({ primary: { $ref: "#/$defs/endpoint" }, replicas: arr({ $ref: "#/$defs/endpoint" }, 2), retries: int(0, 10) }, ["primary"], false) },
  org_chart: { $defs: { person: obj({ name: str(16), title: str(16), reports: arr({ $ref: "#/$defs/person" }, 2) }, ["name", "reports"], false) }, $ref: "#/$defs/person" },
  file_tree: { definitions: { node: { anyOf: [obj({ file: str(16), size: int(0, 1e9) }, undefined, false), obj({ dir: str(16), children: arr({ $ref: "#/definitions/node" }, 3) }, undefined, false)] } }, $ref: "#/definitions/node" },
  // response formats with loose objects, map types and type unions
  metadata_map: { type: "object", additionalProperties: str(16), maxProperties: undefined },
  scores_map: { type: "object", additionalProperties: int(0, 100) },
  open_object: obj({ id: int(1, 1000), name: str(16) }, ["id"], true),
  tuple_point: { type: "array", prefixItems: [num(-180, 180), num(-90, 90)], items: false },
  tuple_rgb: { type: "array", prefixItems: [int(0, 255), int(0, 255), int(0, 255)] },
  type_union: obj({ value: { type: ["integer", "boolean", "null"] }, label: { type: ["string", "null"], maxLength: 10 } }, undefined, false),
  any_value: obj({ key: str(10), value: { anyOf: [str(12), int(-100, 100), bool, { type: "null" }, arr(int(0, 9), 3)] } }, undefined, false),
  enum_mixed: obj({ level: { enum: [1, 2, 3, "max", null, true] }, mode: { const: "fast" } }, undefined, false),
  const_object: obj({ version: { const: { major: 1, minor: [2, 3] } }, ok: bool }, undefined, false),
  bounded_numbers: obj({ ratio: num(0, 1), temp_c: num(-273.15, 1000), prob: { type: "number", exclusiveMinimum: 0, exclusiveMaximum: 1 },
    delta: { type: "number", minimum: -0.5, maximum: 0.5 }, big: num(1e5, 1e9), neg: { type: "number", exclusiveMaximum: 0, minimum: -3 } }, undefined, false),
  integer_edges: obj({ zero: int(0, 0), neg: int(-99999, -1000), wide: int(-2147483648, 2147483647), open_min: int(10), open_max: int(undefined, -5),
    excl: { type: "integer", exclusiveMinimum: 0, exclusiveMaximum: 10 } }, undefined, false),
  string_lengths: obj({ code: { type: "string", minLength: 3, maxLength: 3 }, short: str(4, { minLength: 1 }), empty_ok: str(2) }, undefined, false),
  array_bounds: obj({ exactly2: arr(int(0, 9), 2, 2), one_to_three: arr(en("a", "b", "c"), 3, 1), none: arr(bool, 0), nested: arr(arr(int(0, 5), 2, 1), 2, 1) }, undefined, false),
  optional_all: obj({ a: str(8), b: int(0, 9), c: bool, d: arr(int(0, 3), 2) }, [], false),
  no_type_object: { properties: { x: int(0, 10), y: int(0, 10) }, required: ["x", "y"], additionalProperties: false },
  all_of_one: { allOf: [obj({ id: UUID, ts: DT }, undefined, false)] },
  described: { title: "Person", description: "A person record", $schema: "https://json-schema.org/draft/2020-12/schema", type: "object",
    properties: { name: { ...str(20), description: "Full name", examples: ["Ada"] }, age: { ...int(0, 130), default: 30 } }, required: ["name", "age"], additionalProperties: false },
};
for (const s of Object.values(HAND)) for (const k of Object.keys(s)) if (s[k] === undefined) delete s[k];

// Schemas the server must refuse (oneOf whose branches may overlap), each with the keyword its 400
// must name.
export const REFUSE = {
  oneof_overlap_types: [{ oneOf: [{ type: "integer" }, { type: "number" }] }, "oneOf"],
  oneof_overlap_strings: [{ oneOf: [str(8), { type: "string", pattern: "^[a-z]{2}$" }] }, "oneOf"],
  oneof_no_discriminator: [{ oneOf: [obj({ a: int(0, 9) }, []), obj({ b: int(0, 9) }, [])] }, "oneOf"],
  unique_items: [{ type: "array", items: int(0, 9), uniqueItems: true }, "uniqueItems"],
  multiple_of: [{ type: "number", multipleOf: 0.25 }, "multipleOf"],
  not_kw: [{ not: { type: "null" } }, "not"],
  empty_interval: [{ type: "number", minimum: 0.2, maximum: 0.8 }, "minimum"],
};

// ---- the seeded generator ----

function rng(seed) { // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ["id", "name", "title", "city", "count", "price", "tags", "status", "user", "items", "note", "score", "kind", "when",
  "owner", "path", "query", "limit", "color", "size", "level", "unit", "lang", "flag", "code", "mode", "rate", "total", "email", "ref"];
const PATTERNS = ["^[A-Z]{3}$", "^[a-z0-9_]{3,10}$", "^\\+?[0-9]{7,11}$", "^#[0-9a-fA-F]{6}$", "^(yes|no|maybe)$", "^v[0-9]\\.[0-9]{1,2}$", "^[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?$"];
const FORMATS = ["date", "time", "date-time", "uuid", "email", "ipv4"];

// A generator of schemas from rand: gen(depth) returns one schema; defs collects $defs entries.
function makeGen(rand) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const irange = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
  let defs = {}, ndefs = 0;
  const round = (x, d) => Number(x.toFixed(d));
  function scalar() {
    const k = pick(["string", "string", "enum", "format", "pattern", "integer", "integer", "number", "number", "boolean", "null", "const", "union"]);
    switch (k) {
      case "string": { const mx = irange(0, 24), s = { type: "string", maxLength: mx }; if (rand() < 0.3) s.minLength = irange(0, mx); return s; }
      case "enum": { const n = irange(1, 5), v = new Set(); while (v.size < n) v.add(pick(WORDS) + (rand() < 0.2 ? irange(0, 9) : "")); return rand() < 0.5 ? { type: "string", enum: [...v] } : { enum: [...v] }; }
      case "format": return { type: "string", format: pick(FORMATS) };
      case "pattern": return { type: "string", pattern: pick(PATTERNS) };
      case "integer": {
        const s = { type: "integer" }, r = rand();
        if (r < 0.7) { const lo = irange(-1000, 1000); s[rand() < 0.8 ? "minimum" : "exclusiveMinimum"] = lo; s[rand() < 0.8 ? "maximum" : "exclusiveMaximum"] = lo + irange(2, 5000); }
        else if (r < 0.85) s.minimum = irange(-50, 50);
        else if (r < 0.92) s.maximum = irange(-50, 50);
        return s;
      }
      case "number": {
        const s = { type: "number" }, r = rand();
        if (r < 0.75) {
          const lo = round((rand() - 0.5) * Math.pow(10, irange(0, 5)), irange(0, 3)), w = round(1.5 + rand() * Math.pow(10, irange(0, 4)), irange(0, 2));
          s[rand() < 0.7 ? "minimum" : "exclusiveMinimum"] = lo;
          s[rand() < 0.7 ? "maximum" : "exclusiveMaximum"] = round(lo + w, 3);
        } else if (r < 0.85) s.minimum = round((rand() - 0.5) * 100, 2);
        else if (r < 0.9) s.exclusiveMaximum = round((rand() - 0.5) * 100, 2);
        return s;
      }
      case "boolean": return { type: "boolean" };
      case "null": return { type: "null" };
      case "const": return { const: pick([pick(WORDS), irange(-9, 99), true, null, 2.5, { a: 1 }, [1, "x"]]) };
      case "union": return pick([{ type: ["string", "null"], maxLength: irange(1, 12) }, { type: ["integer", "boolean"] }, { type: ["number", "null"], minimum: 0, maximum: 10 }, { type: ["integer", "string"], maxLength: 5, minimum: 0, maximum: 99 }]);
    }
  }
  function object(depth) {
    const n = irange(1, 5), props = {};
    while (Object.keys(props).length < n) props[pick(WORDS) + (rand() < 0.3 ? "_" + irange(1, 9) : "")] = gen(depth + 1);
    const keys = Object.keys(props), r = rand();
    const required = r < 0.5 ? keys : r < 0.8 ? keys.filter(() => rand() < 0.5) : [];
    const s = { type: "object", properties: props, required };
    const ap = rand();
    if (ap < 0.5) s.additionalProperties = false; else if (ap < 0.65) s.additionalProperties = true; else if (ap < 0.7) s.additionalProperties = { type: "integer", minimum: 0, maximum: 9 };
    if (rand() < 0.1) delete s.type; // properties alone imply an object to the grammar (not to a validator)
    return s;
  }
  function array(depth) {
    const mx = irange(0, 4), s = { type: "array", items: gen(depth + 1), maxItems: mx };
    if (rand() < 0.5) s.minItems = irange(0, mx);
    if (rand() < 0.1) return { type: "array", prefixItems: [gen(depth + 1), gen(depth + 1)], items: false };
    return s;
  }
  // oneOf with provably exclusive branches: distinct types, or a const discriminator
  function oneOf(depth) {
    if (rand() < 0.5) {
      const types = ["string", "integer", "boolean", "null", "object", "array"].sort(() => rand() - 0.5).slice(0, irange(2, 3));
      // (each branch states its type: a validator lets a value of any type through a schema without one)
      return { oneOf: types.map((t) => t === "object" ? { ...object(depth + 1), type: "object" } : t === "array" ? array(depth + 1) : t === "string" ? { type: "string", maxLength: 10 } : { type: t }) };
    }
    const tag = pick(["kind", "type", "op"]), n = irange(2, 3);
    return { oneOf: Array.from({ length: n }, (_, i) => {
      const o = object(depth + 1);
      o.properties = { ...o.properties, [tag]: { const: `${tag}${i}` } }; // (the tag wins over a generated property of that name)
      o.required = [tag, ...o.required.filter((k) => k !== tag)];
      o.type = "object";
      return o;
    }) };
  }
  function gen(depth = 0) {
    const r = rand();
    if (depth >= 3 || r < 0.45) return scalar();
    if (r < 0.7) return object(depth);
    if (r < 0.82) return array(depth);
    if (r < 0.9) return { anyOf: Array.from({ length: irange(2, 3) }, () => gen(depth + 1)) };
    if (r < 0.96) return oneOf(depth);
    const name = "d" + ndefs++;
    defs[name] = gen(depth + 1);
    return { $ref: "#/$defs/" + name };
  }
  return { gen, object, takeDefs: () => { const d = defs; defs = {}; ndefs = 0; return d; } };
}

// n generated schemas from seed (deterministic). Roots are objects (as tool parameters and most
// response formats are) three times in four.
export function generated(seed, n) {
  const rand = rng(seed), g = makeGen(rand), out = [];
  for (let i = 0; i < n; i++) {
    const schema = rand() < 0.75 ? g.object(0) : g.gen(0);
    const defs = g.takeDefs();
    if (Object.keys(defs).length) schema.$defs = defs;
    out.push({ name: `gen${seed}-${i}`, schema });
  }
  return out;
}

// The whole corpus: hand-written (each also in a "strict" variant: every property required and no
// extra properties, what OpenAI's strict mode demands), refusals, then n generated.
export function corpus({ seed = 20, n = 500 } = {}) {
  const strictify = (s) => {
    if (Array.isArray(s)) return s.map(strictify);
    if (!s || typeof s !== "object") return s;
    const o = {};
    for (const [k, v] of Object.entries(s)) o[k] = k === "const" || k === "enum" ? v : strictify(v);
    if (o.type === "object" && o.properties) { o.required = Object.keys(o.properties); o.additionalProperties = false; }
    return o;
  };
  const out = [];
  for (const [name, schema] of Object.entries(HAND)) out.push({ name, schema });
  for (const [name, schema] of Object.entries(HAND)) out.push({ name: name + "/strict", schema: strictify(schema) });
  for (const [name, [schema, kw]] of Object.entries(REFUSE)) out.push({ name, schema, expect: "refuse:" + kw });
  return out.concat(generated(seed, n));
}
