//! The resource guard of chat-template rendering.
//!
//! minijinja bounds the instructions a render executes (fuel) but not the size of the values
//! they make: `{% set ns.s = ns.s ~ ns.s %}` in a loop, or a macro that recurses on `s ~ s`,
//! doubles a string per step, and a namespace stored into itself (`{% set ns.n = ns %}`) is an
//! `Arc` cycle that is never freed and that minijinja prints by unbounded recursion. Its public
//! API has no hook on its operators, so this module rewrites each compiled template's bytecode
//! (through minijinja's `unstable_machinery`, pinned to 2.24.0 in the workspace) before it runs:
//!
//! * Before every instruction whose cost or result grows with its operands (`~`, `+`, `*`,
//!   comparisons, `in`, indexing, slicing, `{% set ns.x = … %}`, method calls, `*args`
//!   unpacking) it inserts a call to a guard function that measures the operands, refuses
//!   results over the caps and charges the render's work budget. The guard sees an operand
//!   that is not on top of the stack by moving the values above it to a side stack and back
//!   (`PUSH`/`POP`), so the original instruction still runs unchanged: a template within the
//!   limits renders exactly as with plain minijinja.
//! * After every list and map literal it checks the nesting depth; after
//!   every call and captured block, the length of the string it made.
//! * `EmitRaw` (template text) becomes `LoadConst` + `Emit`, so all output (also output
//!   captured by `{% set %}` blocks, macros and `caller()`) goes through one formatter, which
//!   charges it.
//! * `include`, `extends` and `import` are refused (a chat template has no other templates).
//!
//! Filters, tests, Python-style methods and the `namespace`/`dict` globals are replaced by
//! wrappers of minijinja's own that check their arguments first (`join`, `replace`, `indent`,
//! `format`, `tojson`, … can expand their input by an argument's factor) and their result
//! after; the wrappers also guard the filters and tests that `map`, `select` and friends call
//! by name. A namespace may hold only strings, numbers, lists and maps, never a namespace
//! (in any depth), a macro, a loop or a function, so namespaces can form no cycle. `debug()` is
//! removed (minijinja-only, unused by chat templates, and it prints the whole state).
//!
//! Limits: [`TEMPLATE_MAX_VALUE`] bytes per string (or printed value), [`TEMPLATE_MAX_ITEMS`]
//! values per list/map (counted through its nesting), [`TEMPLATE_MAX_DEPTH`] levels of nesting,
//! and [`TEMPLATE_MAX_WORK`] bytes per render of values created, scanned or written (each
//! value visited while measuring or iterating counts [`VISIT_COST`] bytes, each byte of a
//! string scanned [`SCAN_COST`]). [`check_source`] bounds what compiling a template costs.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use super::{
    TEMPLATE_MAX_DEPTH, TEMPLATE_MAX_FOLD, TEMPLATE_MAX_ITEMS, TEMPLATE_MAX_NAMESPACES,
    TEMPLATE_MAX_SOURCE, TEMPLATE_MAX_TAG_TOKENS, TEMPLATE_MAX_VALUE, TEMPLATE_MAX_WORK,
};

/// Work-budget bytes charged per value visited when a value is measured or iterated (what
/// visiting a value costs relative to copying bytes: iterating minijinja's lazy sequences
/// goes through a chain of boxed iterators).
pub(super) const VISIT_COST: usize = 128;

/// Work-budget bytes charged per byte of a string scanned (searched, compared, counted in
/// chars): scanning costs more than copying, which moves whole blocks.
pub(super) const SCAN_COST: usize = 4;

// Guard functions, as globals whose names are no identifiers (a template cannot shadow them).
const PUSH: &str = "infer-guard push";
const POP: &str = "infer-guard pop";
const CONCAT: &str = "infer-guard concat";
const ADD: &str = "infer-guard add";
const MUL: &str = "infer-guard mul";
const COMPARE: &str = "infer-guard compare";
const INDEX: &str = "infer-guard index";
const SLICE: &str = "infer-guard slice";
const STORE: &str = "infer-guard store";
const BUILT: &str = "infer-guard built";
const SCAN: &str = "infer-guard scan";
const SCAN_ALL: &str = "infer-guard scan all";
const SIZED: &str = "infer-guard sized";

/// Per-render state on the rendering thread (minijinja renders on the caller's thread).
#[derive(Default)]
struct RenderState {
    /// Work-budget bytes charged so far.
    work: usize,
    /// Operands parked by `PUSH` while a guard looks at the value below them.
    side: Vec<Value>,
    /// The namespaces `namespace()` made in this render (to recognise them inside values).
    namespaces: Vec<Value>,
}

thread_local! {
    static RENDER: RefCell<RenderState> = RefCell::new(RenderState::default());
}

/// Resets the per-render state when a render starts and when it ends (also on error).
pub(super) struct RenderScope(());

impl RenderScope {
    /// Start a render on this thread.
    pub(super) fn begin() -> Self {
        reset();
        RenderScope(())
    }
}

impl Drop for RenderScope {
    fn drop(&mut self) {
        reset();
    }
}

fn reset() {
    // The values are dropped after the borrow ends.
    let _old = RENDER.with(|r| std::mem::take(&mut *r.borrow_mut()));
}

fn refuse(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

/// Charge `bytes` to the render's work budget.
fn charge(bytes: usize) -> Result<(), Error> {
    let work = RENDER.with(|r| {
        let mut r = r.borrow_mut();
        r.work = r.work.saturating_add(bytes);
        r.work
    });
    if work > TEMPLATE_MAX_WORK {
        return Err(refuse(format!(
            "the template creates, scans or writes more than {} MiB of values in one render \
             (a template that grows a value without end?)",
            TEMPLATE_MAX_WORK >> 20
        )));
    }
    Ok(())
}

fn check_len(bytes: usize) -> Result<(), Error> {
    if bytes > TEMPLATE_MAX_VALUE {
        return Err(refuse(format!(
            "a template value would exceed {} MiB (a template that grows a value without end?)",
            TEMPLATE_MAX_VALUE >> 20
        )));
    }
    Ok(())
}

fn check_items(items: usize) -> Result<(), Error> {
    if items > TEMPLATE_MAX_ITEMS {
        return Err(refuse(format!(
            "a template value would hold more than {TEMPLATE_MAX_ITEMS} items"
        )));
    }
    Ok(())
}

fn is_namespace(v: &Value) -> bool {
    RENDER.with(|r| {
        r.borrow()
            .namespaces
            .iter()
            .any(|ns| minijinja::tests::is_sameas(v, ns))
    })
}

/// What [`walk`] found in a value.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    /// Values visited (the value itself, every item, key and value, through the nesting).
    values: usize,
    /// Deepest nesting of lists/maps (0: a scalar or string).
    depth: usize,
    /// Bytes of all strings and byte strings.
    str_bytes: usize,
    /// Strings and byte strings.
    strings: usize,
    /// Lists, maps and iterables.
    containers: usize,
    /// Opaque objects (macros, loops, functions: [`is_opaque`]), not looked into.
    plain: usize,
    /// Namespaces.
    namespaces: usize,
}

impl Shape {
    /// Bytes charged for visiting the value's parts.
    fn visits(&self) -> usize {
        self.values.saturating_mul(VISIT_COST)
    }

    /// Bytes charged for visiting the value's parts and scanning its strings.
    fn cost(&self) -> usize {
        self.visits()
            .saturating_add(self.str_bytes.saturating_mul(SCAN_COST))
    }

    /// An upper bound of the value's printed size with `indent` spaces per nesting level
    /// (`repr`-style: strings quoted with every char escaped in at most 6 bytes; numbers at
    /// most 330 bytes, as `1e308` prints in full).
    fn printed_bound(&self, indent: usize) -> usize {
        let per_container = indent.saturating_mul(self.depth + 1).saturating_add(8);
        self.str_bytes
            .saturating_mul(6)
            .saturating_add(self.strings.saturating_mul(2))
            .saturating_add(self.values.saturating_mul(330))
            .saturating_add(self.containers.saturating_mul(per_container))
            .saturating_add(self.values.saturating_mul(per_container))
            .saturating_add(self.plain.saturating_mul(256))
    }
}

/// Measure `v` without recursion: values, nesting depth, string bytes, namespaces. Errors: more
/// than [`TEMPLATE_MAX_ITEMS`] values, or nesting deeper than [`TEMPLATE_MAX_DEPTH`]. Lazy
/// sequences are iterated (they are finite and repeatable: minijinja's own are).
fn walk(v: &Value) -> Result<Shape, Error> {
    let mut s = Shape::default();
    // Scalars and strings, the common case, without the work list.
    match v.kind() {
        ValueKind::String | ValueKind::Bytes => {
            s.values = 1;
            s.strings = 1;
            s.str_bytes = v
                .as_str()
                .map_or_else(|| v.as_bytes().map_or(0, <[u8]>::len), str::len);
            return Ok(s);
        }
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map | ValueKind::Plain => {}
        _ => {
            s.values = 1;
            return Ok(s);
        }
    }
    let mut todo = vec![(v.clone(), 0usize)];
    while let Some((v, depth)) = todo.pop() {
        s.values += 1;
        s.depth = s.depth.max(depth);
        match v.kind() {
            ValueKind::String => {
                s.strings += 1;
                s.str_bytes += v.as_str().map_or(0, str::len);
            }
            ValueKind::Bytes => {
                s.strings += 1;
                s.str_bytes += v.as_bytes().map_or(0, <[u8]>::len);
            }
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
                if depth >= TEMPLATE_MAX_DEPTH {
                    return Err(refuse(format!(
                        "a template value nests lists or maps more than {TEMPLATE_MAX_DEPTH} \
                         deep"
                    )));
                }
                if v.kind() == ValueKind::Map {
                    if is_namespace(&v) {
                        s.namespaces += 1;
                    } else if is_opaque(&v) {
                        s.plain += 1;
                        continue;
                    }
                    s.containers += 1;
                    let pairs = v.as_object().and_then(|o| o.try_iter_pairs());
                    for (k, x) in pairs.into_iter().flatten() {
                        todo.push((k, depth + 1));
                        todo.push((x, depth + 1));
                        check_items(s.values + todo.len())?;
                    }
                } else if let Ok(items) = v.try_iter() {
                    s.containers += 1;
                    for x in items {
                        todo.push((x, depth + 1));
                        check_items(s.values + todo.len())?;
                    }
                }
            }
            ValueKind::Plain => s.plain += 1,
            _ => {}
        }
        check_items(s.values + todo.len())?;
    }
    Ok(s)
}

/// Whether a map-like object is one of minijinja's own opaque objects rather than data:
/// loops and macros are maps of their attributes (`loop.index`, `m.name`) but print as
/// `<loop …>` / `<macro …>` (only the first printed byte is formatted), where data maps and
/// namespaces print as `{…}`.
fn is_opaque(v: &Value) -> bool {
    struct First(Option<u8>);
    impl fmt::Write for First {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            match s.bytes().next() {
                Some(b) => {
                    self.0 = Some(b);
                    Err(fmt::Error)
                }
                None => Ok(()),
            }
        }
    }
    let mut first = First(None);
    let _ = fmt::write(&mut first, format_args!("{v}"));
    first.0 != Some(b'{')
}

/// Walk `v` and charge the walk and scanning its strings (for what compares, hashes or
/// serializes it).
fn scan(v: &Value) -> Result<Shape, Error> {
    let s = walk(v)?;
    charge(s.cost())?;
    Ok(s)
}

/// Walk `v` and charge the walk (for what only holds it).
fn measure(v: &Value) -> Result<Shape, Error> {
    let s = walk(v)?;
    charge(s.visits())?;
    Ok(s)
}

/// A `fmt::Write` that counts and fails past [`TEMPLATE_MAX_VALUE`] bytes.
struct Counter(usize);

impl fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 += s.len();
        if self.0 > TEMPLATE_MAX_VALUE {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// The bytes `v` prints as (`{{ v }}`, `v ~ ''`). Errors: more than [`TEMPLATE_MAX_VALUE`]
/// bytes, or a value [`walk`] refuses (checked first, as printing recurses through the
/// nesting).
fn display_len(v: &Value) -> Result<usize, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.len());
    }
    if matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map | ValueKind::Plain
    ) {
        measure(v)?;
    }
    let mut c = Counter(0);
    if fmt::write(&mut c, format_args!("{v}")).is_err() {
        check_len(TEMPLATE_MAX_VALUE + 1)?;
    }
    Ok(c.0)
}

/// Items of a list/iterable (its length when known, else counted by walking it).
fn items(v: &Value) -> Result<usize, Error> {
    match v.len() {
        Some(n) => Ok(n),
        None => Ok(walk(v)?.values.saturating_sub(1)),
    }
}

/// The value `k` slots below the top of the VM stack when a guard runs (0: the value just
/// above the guarded one), parked by `PUSH`.
fn parked(k: usize) -> Result<Value, Error> {
    RENDER.with(|r| {
        let r = r.borrow();
        r.side
            .len()
            .checked_sub(k + 1)
            .map(|i| r.side[i].clone())
            .ok_or_else(|| {
                refuse("internal error: the template guard's side stack is empty".into())
            })
    })
}

/// Replaces the parked value `k` (as [`parked`] numbers them), which `POP` then puts back on the
/// VM stack in place of the original.
fn set_parked(k: usize, v: Value) -> Result<(), Error> {
    RENDER.with(|r| {
        let mut r = r.borrow_mut();
        let n = r.side.len();
        let i = n.checked_sub(k + 1).ok_or_else(|| {
            refuse("internal error: the template guard's side stack is empty".into())
        })?;
        r.side[i] = v;
        Ok(())
    })
}

fn push(v: Value) -> Value {
    RENDER.with(|r| r.borrow_mut().side.push(v));
    Value::UNDEFINED
}

fn pop() -> Result<Value, Error> {
    RENDER
        .with(|r| r.borrow_mut().side.pop())
        .ok_or_else(|| refuse("internal error: the template guard's side stack is empty".into()))
}

/// `a ~ b`: both printed, concatenated.
fn concat(a: Value) -> Result<Value, Error> {
    let b = parked(0)?;
    let n = display_len(&a)?.saturating_add(display_len(&b)?);
    check_len(n)?;
    charge(n)?;
    Ok(Value::UNDEFINED)
}

/// `a + b`: strings concatenated, lists chained, numbers added.
fn add(a: Value) -> Result<Value, Error> {
    let b = parked(0)?;
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        let n = x.len().saturating_add(y.len());
        check_len(n)?;
        charge(n)?;
    } else if is_sequence(&a) && is_sequence(&b) {
        let n = items(&a)?.saturating_add(items(&b)?);
        check_items(n)?;
        charge(n.saturating_mul(VISIT_COST))?;
    }
    Ok(Value::UNDEFINED)
}

fn is_sequence(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// `a * b`: a string or list repeated, or numbers multiplied.
fn mul(a: Value) -> Result<Value, Error> {
    let b = parked(0)?;
    for (x, n) in [(&a, &b), (&b, &a)] {
        let Some(n) = n.as_usize() else { continue };
        if let Some(s) = x.as_str() {
            let len = s.len().saturating_mul(n);
            check_len(len)?;
            charge(len)?;
        } else if is_sequence(x) {
            let len = items(x)?.saturating_mul(n);
            check_items(len)?;
            charge(len.saturating_mul(VISIT_COST))?;
        }
    }
    Ok(Value::UNDEFINED)
}

/// `==`, `<`, `in`, …: both operands scanned (comparisons recurse through lists and maps).
fn compare(a: Value) -> Result<Value, Error> {
    scan(&a)?;
    scan(&parked(0)?)?;
    Ok(Value::UNDEFINED)
}

/// `a[i]`: a string is indexed by chars (linear), a lazy sequence by iterating.
fn index(a: Value) -> Result<Value, Error> {
    if let Some(s) = a.as_str() {
        charge(s.len().saturating_mul(SCAN_COST))?;
    } else if a.kind() == ValueKind::Iterable {
        charge(items(&a)?.saturating_mul(VISIT_COST))?;
    }
    Ok(Value::UNDEFINED)
}

/// `a[i:j:k]`: linear in `a`. A backward slice (`k < 0`) whose result is empty — of an empty
/// value, or with the stop past the start — becomes `a[0:0]` (the same empty result): minijinja
/// 2.24's `range_step_backwards` yields index 0 of an empty value (`""[::-1]`, `[][::-2]`
/// panic, fuzzing finding 6) and subtracts past zero when the stop exceeds the start.
fn slice(a: Value) -> Result<Value, Error> {
    let len = if let Some(s) = a.as_str() {
        charge(s.len().saturating_mul(SCAN_COST))?;
        Some(s.chars().count())
    } else if is_sequence(&a) {
        let n = items(&a)?;
        charge(n.saturating_mul(VISIT_COST))?;
        Some(n)
    } else {
        a.as_bytes().map(<[u8]>::len)
    };
    let step = parked(2)?;
    if let (Some(len), Some(step)) = (len, step.as_i64()) {
        if step < 0 && backward_slice_is_empty(len, parked(0)?.as_i64(), parked(1)?.as_i64()) {
            set_parked(0, Value::from(0))?;
            set_parked(1, Value::from(0))?;
            set_parked(2, Value::from(1))?;
        }
    }
    Ok(Value::UNDEFINED)
}

/// Whether `a[start:stop:k]` with `k < 0` over `len` items selects nothing (the bounds resolved
/// as minijinja's `range_step_backwards` resolves them; a missing bound is `None`).
fn backward_slice_is_empty(len: usize, start: Option<i64>, stop: Option<i64>) -> bool {
    if len == 0 {
        return true;
    }
    let end = len as i64;
    let start = match start {
        None => end - 1,
        Some(s) if s >= end => end - 1,
        Some(s) if s >= 0 => s,
        Some(s) => (end + s).max(0),
    };
    let stop = match stop {
        None => 0,
        Some(s) if s < 0 => (end + s).max(0),
        Some(s) => s,
    };
    stop > start
}

/// `{% set ns.x = v %}`: `v` may hold no namespace (a cycle) and no opaque object (a loop
/// holds its iterable, a macro its closure: either may hold the namespace).
fn store(v: Value) -> Result<Value, Error> {
    let s = measure(&v)?;
    if s.namespaces > 0 {
        return Err(refuse(
            "a namespace cannot be stored in a namespace, also not inside a list or map \
             (`{% set ns.x = ns %}` would make a cycle)"
                .into(),
        ));
    }
    if s.plain > 0 {
        return Err(refuse(
            "a namespace attribute can hold strings, numbers, booleans, lists and maps, not a \
             macro, loop or function"
                .into(),
        ));
    }
    Ok(Value::UNDEFINED)
}

/// A list or map literal just built: its nesting is checked (items that are no lists or maps,
/// the common case, without walking).
fn built(v: Value) -> Result<Value, Error> {
    let mut n = 0usize;
    if let Ok(items) = v.try_iter() {
        for item in items {
            n += 1;
            let item = if v.kind() == ValueKind::Map {
                v.get_item(&item).unwrap_or_default()
            } else {
                item
            };
            if matches!(
                item.kind(),
                ValueKind::Seq | ValueKind::Iterable | ValueKind::Map | ValueKind::Plain
            ) {
                let s = measure(&item)?;
                if s.depth + 1 >= TEMPLATE_MAX_DEPTH {
                    walk(&v)?; // the nesting error, with its message
                }
            }
        }
    }
    charge(n.saturating_add(1).saturating_mul(VISIT_COST))?;
    Ok(Value::UNDEFINED)
}

/// The result of a call, a `{% set %}` block or a `{% filter %}` block: a string of at most
/// [`TEMPLATE_MAX_VALUE`] bytes (its bytes were charged as they were written).
fn sized(v: Value) -> Result<Value, Error> {
    check_len(v.as_str().map_or(0, str::len))?;
    Ok(Value::UNDEFINED)
}

/// A method argument or a method's receiver: its top level ([`shallow`]); a list's `count`
/// is measured through its nesting by [`check_method_args`].
fn scan_arg(v: Value) -> Result<Value, Error> {
    charge(shallow(&v)?)?;
    Ok(Value::UNDEFINED)
}

/// A `*args` list or a `{% set a, b = … %}` value: through its nesting.
fn scan_all(v: Value) -> Result<Value, Error> {
    measure(&v)?;
    Ok(Value::UNDEFINED)
}

/// `namespace(**defaults)`: the defaults obey the rules of [`store`]; at most
/// [`TEMPLATE_MAX_NAMESPACES`] per render (each is compared with every map a guard measures).
fn namespace(defaults: Option<Value>) -> Result<Value, Error> {
    if let Some(d) = &defaults {
        store(d.clone())?;
    }
    let n = RENDER.with(|r| r.borrow().namespaces.len());
    if n >= TEMPLATE_MAX_NAMESPACES {
        return Err(refuse(format!(
            "more than {TEMPLATE_MAX_NAMESPACES} namespace() objects in one render"
        )));
    }
    let ns = minijinja::functions::namespace(defaults)?;
    RENDER.with(|r| r.borrow_mut().namespaces.push(ns.clone()));
    Ok(ns)
}

/// The sum of the numbers written in `s` (an upper bound of the widths and precisions a
/// printf- or `str.format`-style format string asks for).
fn numbers_in(s: &str) -> usize {
    let mut total = 0usize;
    let mut n = 0usize;
    for c in s.chars() {
        match c.to_digit(10) {
            Some(d) => n = n.saturating_mul(10).saturating_add(d as usize),
            None => {
                total = total.saturating_add(n);
                n = 0;
            }
        }
    }
    total.saturating_add(n)
}

/// Pieces `s` splits into at most (by `sep`, or by whitespace / line breaks when `None`).
fn pieces(s: &str, sep: Option<&str>) -> usize {
    match sep {
        Some("") | None => s.len() + 1,
        Some(sep) => s.matches(sep).count() + 1,
    }
}

/// The work of looking at the top level of `v` (a filter iterating a list, a method scanning
/// a string): [`SCAN_COST`] per byte of a string, or [`VISIT_COST`] per item of a list or map (an unsized lazy
/// sequence is counted by iterating it). Errors: more than [`TEMPLATE_MAX_ITEMS`] items.
fn shallow(v: &Value) -> Result<usize, Error> {
    Ok(match v.kind() {
        ValueKind::String => v.as_str().map_or(0, str::len).saturating_mul(SCAN_COST),
        ValueKind::Bytes => v
            .as_bytes()
            .map_or(0, <[u8]>::len)
            .saturating_mul(SCAN_COST),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            let n = match v.len() {
                Some(n) => n,
                None => {
                    let mut n = 0usize;
                    for _ in v.try_iter().into_iter().flatten() {
                        n += 1;
                        check_items(n)?;
                    }
                    n
                }
            };
            check_items(n)?;
            n.saturating_mul(VISIT_COST)
        }
        _ => VISIT_COST,
    })
}

/// Filters that compare, hash or serialize the values they are given, recursing through them
/// (their arguments are measured through their nesting); the others look at the top level.
const DEEP_FILTERS: &[&str] = &[
    "tojson", "pprint", "sum", "sort", "unique", "dictsort", "groupby", "min", "max",
];

/// Filters that take the same time for any size of list or map (`length` of a list is its
/// stored length): charged one visit per argument when given a sized list or map (a string
/// is charged its bytes: its length is counted in chars).
const CHEAP_FILTERS: &[&str] = &[
    "length", "count", "first", "default", "d", "attr", "bool", "abs", "round", "safe",
];

/// Filters that print a non-string value to work on it (its printed size is checked).
const STRING_FILTERS: &[&str] = &[
    "escape",
    "e",
    "upper",
    "lower",
    "title",
    "capitalize",
    "trim",
    "replace",
    "indent",
    "format",
    "split",
    "lines",
    "string",
    "safe",
    "int",
    "float",
];

/// Checks and charges of a filter's arguments before it runs ([`check_filter_args`]).
fn check_filter(name: &str, args: &[Value]) -> Result<(), Error> {
    let mut shapes = Vec::new();
    if DEEP_FILTERS.contains(&name) {
        shapes = args.iter().map(scan).collect::<Result<_, _>>()?;
    } else if CHEAP_FILTERS.contains(&name)
        && args
            .first()
            .is_some_and(|v| v.as_str().is_none() && v.len().is_some())
    {
        charge(args.len().saturating_mul(VISIT_COST))?;
    } else {
        for a in args {
            charge(shallow(a)?)?;
        }
    }
    if let Some(v) = args.first() {
        if STRING_FILTERS.contains(&name) && v.as_str().is_none() && !v.is_kwargs() {
            let n = display_len(v)?;
            check_len(n)?;
            charge(n)?;
        }
    }
    check_filter_args(name, args, &shapes)
}

/// Checks of a filter's (or method's) arguments before it runs, for the ones whose output can
/// be far larger than their input: `join`, `replace`, `indent`, `format`, `tojson`, `pprint`,
/// `string`, `batch`, `slice`, `sum`, `list`, `split`, `lines`. `shapes`: the arguments'
/// [`walk`]s, for the [`DEEP_FILTERS`].
fn check_filter_args(name: &str, args: &[Value], shapes: &[Shape]) -> Result<(), Error> {
    let arg = |i: usize| args.get(i).filter(|v| !v.is_kwargs());
    let kwarg = |key: &str| {
        args.last()
            .filter(|v| v.is_kwargs())
            .and_then(|k| k.get_attr(key).ok())
            .filter(|v| !v.is_undefined())
    };
    let text = |i: usize| arg(i).and_then(Value::as_str);
    match name {
        "join" => {
            let sep = text(1).map_or(0, str::len);
            let mut n = 0usize;
            if let Some(s) = text(0) {
                n = s.len().saturating_mul(sep + 1);
            } else if let Some(Ok(items)) = arg(0).map(Value::try_iter) {
                for item in items {
                    n = n.saturating_add(display_len(&item)?).saturating_add(sep);
                    check_len(n)?;
                }
            }
            check_len(n)
        }
        "replace" => {
            let (Some(s), Some(old), Some(new)) = (text(0), text(1), text(2)) else {
                return Ok(());
            };
            let hits = if old.is_empty() {
                s.chars().count() + 1
            } else {
                s.matches(old).count()
            };
            check_len(s.len().saturating_add(hits.saturating_mul(new.len())))
        }
        "indent" => {
            let width = arg(1)
                .cloned()
                .or_else(|| kwarg("width"))
                .and_then(|v| v.as_usize())
                .unwrap_or(4);
            let s = text(0).unwrap_or("");
            let lines = s.matches('\n').count() + 1;
            check_len(s.len().saturating_add(lines.saturating_mul(width)))
        }
        "format" => {
            let fmt = text(0).unwrap_or("");
            let mut n = fmt.len().saturating_add(numbers_in(fmt));
            for v in args.iter().skip(1) {
                n = n.saturating_add(display_len(v)?);
            }
            check_len(n)
        }
        "tojson" | "pprint" => {
            let indent = match arg(1).cloned().or_else(|| kwarg("indent")) {
                _ if name == "pprint" => 4,
                Some(v) if v.kind() == ValueKind::Bool => 2,
                Some(v) => v.as_usize().unwrap_or(0),
                None => 0,
            };
            check_len(shapes.first().map_or(0, |s| s.printed_bound(indent)))
        }
        "string" => arg(0).map_or(Ok(()), |v| display_len(v).and_then(check_len)),
        "batch" | "slice" => check_items(arg(1).and_then(Value::as_usize).unwrap_or(0)),
        "sum" => check_len(shapes.iter().map(|s| s.str_bytes).sum()),
        "list" | "split" | "lines" => match text(0) {
            Some(s) if name == "split" => check_items(pieces(s, text(1))),
            Some(s) if name == "lines" => check_items(s.matches('\n').count() + 1),
            Some(s) => check_items(s.chars().count()),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Checks of a filter's or method's result: a string of at most [`TEMPLATE_MAX_VALUE`] bytes,
/// a list/map [`walk`] accepts; charged.
fn check_result(v: &Value) -> Result<(), Error> {
    if let Some(s) = v.as_str() {
        check_len(s.len())?;
        charge(s.len())
    } else {
        measure(v).map(|_| ())
    }
}

/// Checks of a Python-style string method's arguments (`s.replace`, `s.join`, `s.format`,
/// `s.split`, `s.splitlines`), the rest as [`check_filter_args`].
fn check_method_args(value: &Value, method: &str, args: &[Value]) -> Result<(), Error> {
    let Some(s) = value.as_str() else {
        if method == "count" {
            scan(value)?; // `list.count(x)` compares every item with `x`
            args.iter().try_for_each(|a| scan(a).map(drop))?;
        }
        return Ok(());
    };
    let mut all = Vec::with_capacity(args.len() + 1);
    all.push(value.clone());
    all.extend(args.iter().cloned());
    match method {
        "replace" => check_filter_args("replace", &all, &[]),
        "format" => check_filter_args("format", &all, &[]),
        "split" => check_items(pieces(s, args.first().and_then(Value::as_str))),
        "splitlines" => check_items(s.matches('\n').count() + 1),
        "join" => {
            let mut n = 0usize;
            if let Some(v) = args.first() {
                if let Some(t) = v.as_str() {
                    n = t.len().saturating_mul(s.len() + 1);
                } else if let Ok(items) = v.try_iter() {
                    for item in items {
                        n = n
                            .saturating_add(display_len(&item)?)
                            .saturating_add(s.len());
                        check_len(n)?;
                    }
                }
            }
            check_len(n)
        }
        _ => Ok(()),
    }
}

/// minijinja 2.24's builtin filters (`defaults.rs`, features `builtins` and `json`).
fn builtin_filters() -> Vec<(&'static str, Value)> {
    use minijinja::filters as f;
    vec![
        ("safe", Value::from_function(f::safe)),
        ("escape", Value::from_function(f::escape)),
        ("e", Value::from_function(f::escape)),
        ("lower", Value::from_function(f::lower)),
        ("upper", Value::from_function(f::upper)),
        ("title", Value::from_function(f::title)),
        ("capitalize", Value::from_function(f::capitalize)),
        ("replace", Value::from_function(f::replace)),
        ("length", Value::from_function(f::length)),
        ("count", Value::from_function(f::length)),
        ("dictsort", Value::from_function(f::dictsort)),
        ("items", Value::from_function(f::items)),
        ("reverse", Value::from_function(f::reverse)),
        ("trim", Value::from_function(f::trim)),
        ("join", Value::from_function(f::join)),
        ("split", Value::from_function(f::split)),
        ("lines", Value::from_function(f::lines)),
        ("default", Value::from_function(f::default)),
        ("d", Value::from_function(f::default)),
        ("round", Value::from_function(f::round)),
        ("abs", Value::from_function(f::abs)),
        ("int", Value::from_function(f::int)),
        ("float", Value::from_function(f::float)),
        ("attr", Value::from_function(f::attr)),
        ("first", Value::from_function(f::first)),
        ("last", Value::from_function(f::last)),
        ("min", Value::from_function(f::min)),
        ("max", Value::from_function(f::max)),
        ("sort", Value::from_function(f::sort)),
        ("list", Value::from_function(f::list)),
        ("string", Value::from_function(f::string)),
        ("bool", Value::from_function(f::bool)),
        ("batch", Value::from_function(f::batch)),
        ("slice", Value::from_function(f::slice)),
        ("sum", Value::from_function(f::sum)),
        ("indent", Value::from_function(f::indent)),
        ("select", Value::from_function(f::select)),
        ("reject", Value::from_function(f::reject)),
        ("selectattr", Value::from_function(f::selectattr)),
        ("rejectattr", Value::from_function(f::rejectattr)),
        ("map", Value::from_function(f::map)),
        ("groupby", Value::from_function(f::groupby)),
        ("unique", Value::from_function(f::unique)),
        ("chain", Value::from_function(f::chain)),
        ("zip", Value::from_function(f::zip)),
        ("pprint", Value::from_function(f::pprint)),
        ("format", Value::from_function(f::format)),
        ("tojson", Value::from_function(f::tojson)),
    ]
}

/// minijinja 2.24's builtin tests (`defaults.rs`, feature `builtins`).
fn builtin_tests() -> Vec<(&'static str, Value)> {
    use minijinja::tests as t;
    vec![
        ("undefined", Value::from_function(t::is_undefined)),
        ("defined", Value::from_function(t::is_defined)),
        ("none", Value::from_function(t::is_none)),
        ("safe", Value::from_function(t::is_safe)),
        ("escaped", Value::from_function(t::is_safe)),
        ("boolean", Value::from_function(t::is_boolean)),
        ("odd", Value::from_function(t::is_odd)),
        ("even", Value::from_function(t::is_even)),
        ("divisibleby", Value::from_function(t::is_divisibleby)),
        ("number", Value::from_function(t::is_number)),
        ("integer", Value::from_function(t::is_integer)),
        ("int", Value::from_function(t::is_integer)),
        ("float", Value::from_function(t::is_float)),
        ("string", Value::from_function(t::is_string)),
        ("sequence", Value::from_function(t::is_sequence)),
        ("iterable", Value::from_function(t::is_iterable)),
        ("mapping", Value::from_function(t::is_mapping)),
        ("startingwith", Value::from_function(t::is_startingwith)),
        ("endingwith", Value::from_function(t::is_endingwith)),
        ("lower", Value::from_function(t::is_lower)),
        ("upper", Value::from_function(t::is_upper)),
        ("sameas", Value::from_function(t::is_sameas)),
        ("eq", Value::from_function(t::is_eq)),
        ("equalto", Value::from_function(t::is_eq)),
        ("==", Value::from_function(t::is_eq)),
        ("ne", Value::from_function(t::is_ne)),
        ("!=", Value::from_function(t::is_ne)),
        ("lt", Value::from_function(t::is_lt)),
        ("lessthan", Value::from_function(t::is_lt)),
        ("<", Value::from_function(t::is_lt)),
        ("le", Value::from_function(t::is_le)),
        ("<=", Value::from_function(t::is_le)),
        ("gt", Value::from_function(t::is_gt)),
        ("greaterthan", Value::from_function(t::is_gt)),
        (">", Value::from_function(t::is_gt)),
        ("ge", Value::from_function(t::is_ge)),
        (">=", Value::from_function(t::is_ge)),
        ("in", Value::from_function(t::is_in)),
        ("true", Value::from_function(t::is_true)),
        ("false", Value::from_function(t::is_false)),
        ("filter", Value::from_function(t::is_filter)),
        ("test", Value::from_function(t::is_test)),
    ]
}

/// Install the guard's functions, wrapped filters, tests, methods and globals, and its
/// formatter in `env` (which must have minijinja's default builtins).
pub(super) fn install(env: &mut Environment<'_>) {
    env.add_function(PUSH, push);
    env.add_function(POP, pop);
    env.add_function(CONCAT, concat);
    env.add_function(ADD, add);
    env.add_function(MUL, mul);
    env.add_function(COMPARE, compare);
    env.add_function(INDEX, index);
    env.add_function(SLICE, slice);
    env.add_function(STORE, store);
    env.add_function(BUILT, built);
    env.add_function(SCAN, scan_arg);
    env.add_function(SCAN_ALL, scan_all);
    env.add_function(SIZED, sized);
    env.add_function("namespace", namespace);
    let dict = Value::from_function(minijinja::functions::dict);
    env.add_function(
        "dict",
        move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
            for a in args.iter() {
                measure(a)?;
            }
            let r = dict.call(state, &args)?;
            check_result(&r)?;
            Ok(r)
        },
    );
    env.remove_global("debug");
    for (name, stock) in builtin_filters() {
        env.add_filter(
            name,
            move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
                check_filter(name, &args)?;
                let r = stock.call(state, &args)?;
                check_result(&r)?;
                Ok(r)
            },
        );
    }
    for (name, stock) in builtin_tests() {
        // Comparing tests recurse through their operands; the others look at a value's type
        // or its first bytes.
        let deep = matches!(
            name,
            "eq" | "equalto"
                | "=="
                | "ne"
                | "!="
                | "lt"
                | "lessthan"
                | "<"
                | "le"
                | "<="
                | "gt"
                | "greaterthan"
                | ">"
                | "ge"
                | ">="
                | "in"
        );
        env.add_test(
            name,
            move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
                for a in args.iter() {
                    if deep {
                        scan(a)?;
                    } else {
                        charge(VISIT_COST)?;
                    }
                }
                stock.call(state, &args)
            },
        );
    }
    env.set_unknown_method_callback(|state, value, method, args| {
        check_method_args(value, method, args)?;
        let r = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)?;
        check_result(&r)?;
        Ok(r)
    });
    env.set_formatter(|out, state, value| {
        let mut n = display_len(value)?;
        if !matches!(state.auto_escape(), AutoEscape::None) {
            n = n.saturating_mul(6); // `&` → `&amp;`, `'` → `&#x27;`
        }
        charge(n)?;
        minijinja::escape_formatter(out, state, value)
    });
}

/// Where an instruction came from, for error messages.
#[derive(Clone, Copy)]
struct Loc {
    span: Option<minijinja::machinery::Span>,
    line: Option<usize>,
}

fn add_at<'s>(out: &mut Instructions<'s>, instr: Instruction<'s>, loc: Loc) {
    match loc {
        Loc {
            span: Some(span), ..
        } => out.add_with_span(instr, span),
        Loc {
            line: Some(line), ..
        } => out.add_with_line(instr, u16::try_from(line).unwrap_or(u16::MAX)),
        _ => out.add(instr),
    };
}

/// Emit a call of `guard` on the value `k` slots below the stack top (0: the top), leaving
/// the stack as it was: the `k` values above it are parked by `PUSH` and restored by `POP`.
fn peek<'s>(out: &mut Instructions<'s>, loc: Loc, k: usize, guard: &'static str) {
    for _ in 0..k {
        add_at(out, Instruction::CallFunction(PUSH, Some(1)), loc);
        add_at(out, Instruction::DiscardTop, loc);
    }
    add_at(out, Instruction::DupTop, loc);
    add_at(out, Instruction::CallFunction(guard, Some(1)), loc);
    add_at(out, Instruction::DiscardTop, loc);
    for _ in 0..k {
        add_at(out, Instruction::CallFunction(POP, Some(0)), loc);
    }
}

/// `src` with the guard calls inserted (module docs) and every jump target and macro offset
/// moved to match. Errors: `include`, `extends`, `import`, and `*args` unpacking into a
/// filter, test or method (whose arguments a guard cannot reach).
pub(super) fn guarded<'s>(src: &Instructions<'s>) -> Result<Instructions<'s>, Error> {
    let n = src.len();
    let mut out = Instructions::new(src.name(), src.source());
    let mut moved = Vec::with_capacity(n + 1);
    for i in 0..n {
        let pc = u32::try_from(i).map_err(|_| refuse("template too long".into()))?;
        let Some(instr) = src.get(pc) else { break };
        moved.push(u32::try_from(out.len()).map_err(|_| refuse("template too long".into()))?);
        let loc = Loc {
            span: src.get_span(pc),
            line: src.get_line(pc),
        };
        match instr {
            Instruction::EmitRaw(text) => {
                let text = Value::from_safe_string((*text).to_string());
                add_at(&mut out, Instruction::LoadConst(text), loc);
                add_at(&mut out, Instruction::Emit, loc);
                continue;
            }
            Instruction::StringConcat => peek(&mut out, loc, 1, CONCAT),
            Instruction::Add => peek(&mut out, loc, 1, ADD),
            Instruction::Mul => peek(&mut out, loc, 1, MUL),
            Instruction::Eq
            | Instruction::Ne
            | Instruction::Lt
            | Instruction::Lte
            | Instruction::Gt
            | Instruction::Gte
            | Instruction::In
            | Instruction::CompareAndPreserve(_) => peek(&mut out, loc, 1, COMPARE),
            Instruction::GetItem => peek(&mut out, loc, 1, INDEX),
            Instruction::Slice => peek(&mut out, loc, 3, SLICE),
            Instruction::SetAttr(_) => peek(&mut out, loc, 1, STORE),
            Instruction::UnpackList(_) => peek(&mut out, loc, 0, SCAN_ALL),
            Instruction::UnpackLists(k) => (0..*k).for_each(|j| peek(&mut out, loc, j, SCAN_ALL)),
            Instruction::CallMethod(_, Some(k)) => {
                (0..usize::from(*k)).for_each(|j| peek(&mut out, loc, j, SCAN))
            }
            Instruction::CallMethod(_, None)
            | Instruction::ApplyFilter(_, None, _)
            | Instruction::PerformTest(_, None, _) => {
                return Err(refuse(
                    "`*args` / `**kwargs` unpacking into a filter, test or method call is not \
                     supported in chat templates"
                        .into(),
                ))
            }
            Instruction::Include(_) | Instruction::LoadBlocks | Instruction::ExportLocals => {
                return Err(refuse(
                    "include, extends and import are not supported in chat templates".into(),
                ))
            }
            _ => {}
        }
        add_at(&mut out, instr.clone(), loc);
        let after = match instr {
            // (Keyword arguments are consumed by the call they are built for.)
            Instruction::BuildList(_) | Instruction::BuildMap(_) => Some(BUILT),
            Instruction::EndCapture
            | Instruction::CallFunction(..)
            | Instruction::CallObject(_) => Some(SIZED),
            _ => None,
        };
        if let Some(guard) = after {
            add_at(&mut out, Instruction::DupTop, loc);
            add_at(&mut out, Instruction::CallFunction(guard, Some(1)), loc);
            add_at(&mut out, Instruction::DiscardTop, loc);
        }
    }
    moved.push(u32::try_from(out.len()).map_err(|_| refuse("template too long".into()))?);
    let relocate = |t: &mut u32| {
        if let Some(&m) = moved.get(*t as usize) {
            *t = m;
        }
    };
    for i in 0..out.len() {
        if let Some(
            Instruction::Jump(t)
            | Instruction::JumpIfFalse(t)
            | Instruction::JumpIfFalseOrPop(t)
            | Instruction::JumpIfTrueOrPop(t)
            | Instruction::Iterate(t)
            | Instruction::BuildMacro(_, t, _),
        ) = out.get_mut(i as u32)
        {
            relocate(t);
        }
    }
    Ok(out)
}

/// [`guarded`] of every block of a compiled template.
pub(super) fn guarded_blocks<'s>(
    blocks: &BTreeMap<&'s str, Instructions<'s>>,
) -> Result<BTreeMap<&'s str, Instructions<'s>>, Error> {
    blocks
        .iter()
        .map(|(name, b)| Ok((*name, guarded(b)?)))
        .collect()
}

/// Checks of a template's source before minijinja compiles it, for what compiling itself can
/// cost: at most [`TEMPLATE_MAX_SOURCE`] bytes; at most [`TEMPLATE_MAX_TAG_TOKENS`] tokens in
/// one `{{ … }}` or `{% … %}` tag (minijinja's code generator recurses once per operator of a
/// chain like `x ~ x ~ …`, and overflowed the stack at ~30,000); and constant folding (minijinja
/// evaluates `'x' * 16000000 ~ 'y'` while compiling, again for every operator above it) of at
/// most [`TEMPLATE_MAX_VALUE`] bytes per constant and [`TEMPLATE_MAX_FOLD`] bytes in all. A
/// source that does not tokenize or parse is left to minijinja to report.
pub(super) fn check_source(source: &str) -> Result<(), Error> {
    use minijinja::machinery::{parse, tokenize, Token};
    if source.len() > TEMPLATE_MAX_SOURCE {
        return Err(refuse(format!(
            "the template is {} bytes, more than the {} KiB a chat template may have",
            source.len(),
            TEMPLATE_MAX_SOURCE >> 10
        )));
    }
    let mut tokens = 0usize;
    for token in tokenize(source, false, Default::default(), Default::default()) {
        let Ok((token, span)) = token else { break };
        match token {
            Token::VariableStart | Token::BlockStart => tokens = 0,
            Token::TemplateData(_) => {}
            _ => {
                tokens += 1;
                if tokens > TEMPLATE_MAX_TAG_TOKENS {
                    return Err(refuse(format!(
                        "the tag ending on line {} has more than {TEMPLATE_MAX_TAG_TOKENS} \
                         tokens",
                        span.end_line
                    )));
                }
            }
        }
    }
    let Ok(ast) = parse(source, "chat", Default::default(), Default::default()) else {
        return Ok(());
    };
    let mut fold = Fold { bytes: 0 };
    fold.stmt(&ast, 0)?;
    Ok(())
}

/// What compiling a template's constant expressions costs (bytes minijinja allocates to fold
/// them, counting every time its code generator folds the same subexpression again).
struct Fold {
    bytes: usize,
}

/// A constant-folded expression: an upper bound of its printed size (`None`: not constant)
/// and the bytes folding it allocates (also when it turns out not constant).
#[derive(Clone, Copy)]
struct Folded {
    size: Option<usize>,
    cost: usize,
}

/// Statements and expressions nested deeper than this are refused (the checks recurse).
const MAX_AST_DEPTH: usize = 4096;

impl Fold {
    fn add(&mut self, bytes: usize) -> Result<(), Error> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > TEMPLATE_MAX_FOLD {
            return Err(refuse(format!(
                "compiling the template's constant expressions would take more than {} MiB",
                TEMPLATE_MAX_FOLD >> 20
            )));
        }
        Ok(())
    }

    fn stmts(
        &mut self,
        body: &[minijinja::machinery::ast::Stmt<'_>],
        depth: usize,
    ) -> Result<(), Error> {
        body.iter().try_for_each(|s| self.stmt(s, depth + 1))
    }

    fn stmt(&mut self, s: &minijinja::machinery::ast::Stmt<'_>, depth: usize) -> Result<(), Error> {
        use minijinja::machinery::ast::Stmt;
        if depth > MAX_AST_DEPTH {
            return Err(refuse("the template nests blocks too deep".into()));
        }
        match s {
            Stmt::Template(t) => self.stmts(&t.children, depth),
            Stmt::EmitExpr(e) => self.expr(&e.expr, depth).map(drop),
            Stmt::EmitRaw(_) => Ok(()),
            Stmt::ForLoop(f) => {
                self.expr(&f.target, depth)?;
                self.expr(&f.iter, depth)?;
                if let Some(e) = &f.filter_expr {
                    self.expr(e, depth)?;
                }
                self.stmts(&f.body, depth)?;
                self.stmts(&f.else_body, depth)
            }
            Stmt::IfCond(c) => {
                self.expr(&c.expr, depth)?;
                self.stmts(&c.true_body, depth)?;
                self.stmts(&c.false_body, depth)
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    self.expr(target, depth)?;
                    self.expr(value, depth)?;
                }
                self.stmts(&w.body, depth)
            }
            Stmt::Set(x) => {
                self.expr(&x.target, depth)?;
                self.expr(&x.expr, depth).map(drop)
            }
            Stmt::SetBlock(x) => {
                self.expr(&x.target, depth)?;
                if let Some(e) = &x.filter {
                    self.expr(e, depth)?;
                }
                self.stmts(&x.body, depth)
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled, depth)?;
                self.stmts(&a.body, depth)
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter, depth)?;
                self.stmts(&f.body, depth)
            }
            Stmt::Block(b) => self.stmts(&b.body, depth),
            Stmt::Import(i) => {
                self.expr(&i.expr, depth)?;
                self.expr(&i.name, depth).map(drop)
            }
            Stmt::FromImport(i) => {
                self.expr(&i.expr, depth)?;
                for (name, alias) in &i.names {
                    self.expr(name, depth)?;
                    if let Some(a) = alias {
                        self.expr(a, depth)?;
                    }
                }
                Ok(())
            }
            Stmt::Extends(e) => self.expr(&e.name, depth).map(drop),
            Stmt::Include(i) => self.expr(&i.name, depth).map(drop),
            Stmt::Macro(m) => self.macro_decl(m, depth),
            Stmt::CallBlock(c) => {
                self.call(&c.call, depth)?;
                self.macro_decl(&c.macro_decl, depth)
            }
            Stmt::Do(d) => self.call(&d.call, depth),
            #[allow(unreachable_patterns)] // `break`/`continue` (feature `loop_controls`)
            _ => Ok(()),
        }
    }

    fn macro_decl(
        &mut self,
        m: &minijinja::machinery::ast::Macro<'_>,
        depth: usize,
    ) -> Result<(), Error> {
        for e in m.args.iter().chain(&m.defaults) {
            self.expr(e, depth)?;
        }
        self.stmts(&m.body, depth)
    }

    fn call(&mut self, c: &minijinja::machinery::ast::Call<'_>, depth: usize) -> Result<(), Error> {
        self.expr(&c.expr, depth)?;
        self.args(&c.args, depth)
    }

    fn args(
        &mut self,
        args: &[minijinja::machinery::ast::CallArg<'_>],
        depth: usize,
    ) -> Result<(), Error> {
        use minijinja::machinery::ast::CallArg;
        for a in args {
            match a {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => {
                    self.expr(e, depth)?;
                }
            }
        }
        Ok(())
    }

    /// Fold `e` as minijinja's `Expr::as_const` does (without evaluating it) and charge the
    /// cost: minijinja's code generator calls `as_const` on every expression it compiles.
    fn expr(
        &mut self,
        e: &minijinja::machinery::ast::Expr<'_>,
        depth: usize,
    ) -> Result<Folded, Error> {
        use minijinja::machinery::ast::{BinOpKind, Expr};
        if depth > MAX_AST_DEPTH {
            return Err(refuse("the template nests expressions too deep".into()));
        }
        let depth = depth + 1;
        let not_const = Folded {
            size: None,
            cost: 16,
        };
        let folded = match e {
            Expr::Var(_) => not_const,
            Expr::Const(c) => Folded {
                size: Some(c.value.as_str().map_or(330, str::len)),
                cost: 16,
            },
            Expr::List(l) => {
                let mut size = Some(2usize);
                for item in &l.items {
                    let f = self.expr(item, depth)?;
                    size = match (size, item) {
                        (Some(n), Expr::Const(_)) => f.size.map(|m| n + 6 * m + 4),
                        _ => None,
                    };
                }
                Folded {
                    size,
                    cost: 16 + 24 * l.items.len(),
                }
            }
            Expr::Map(m) => {
                let mut size = Some(2usize);
                for item in m.keys.iter().chain(&m.values) {
                    let f = self.expr(item, depth)?;
                    size = match (size, item) {
                        (Some(n), Expr::Const(_)) => f.size.map(|m| n + 6 * m + 4),
                        _ => None,
                    };
                }
                Folded {
                    size,
                    cost: 16 + 48 * m.keys.len(),
                }
            }
            Expr::UnaryOp(u) => {
                let f = self.expr(&u.expr, depth)?;
                Folded {
                    size: f.size.map(|_| 330),
                    cost: 16 + f.cost,
                }
            }
            Expr::BinOp(b) => {
                let l = self.expr(&b.left, depth)?;
                let r = self.expr(&b.right, depth)?;
                let size = match (l.size, r.size) {
                    (Some(x), Some(y)) => Some(match b.op {
                        BinOpKind::Concat | BinOpKind::Add => x.saturating_add(y),
                        BinOpKind::Mul => {
                            // `s * n` / `n * s`: a count that is cheap to fold is folded.
                            let count = |e: &Expr<'_>, f: Folded| {
                                (f.cost <= 4096)
                                    .then(|| e.as_const())
                                    .flatten()
                                    .and_then(|v| v.as_usize())
                            };
                            match (count(&b.right, r), count(&b.left, l)) {
                                (Some(n), _) => x.saturating_mul(n).max(330),
                                (_, Some(n)) => y.saturating_mul(n).max(330),
                                _ => 330,
                            }
                        }
                        BinOpKind::ScAnd | BinOpKind::ScOr => x.max(y),
                        _ => 330,
                    }),
                    _ => None,
                };
                Folded {
                    size,
                    cost: (16 + l.cost + r.cost).saturating_add(size.unwrap_or(0)),
                }
            }
            Expr::Compare(c) => {
                let mut f = self.expr(&c.expr, depth)?;
                for op in &c.ops {
                    let o = self.expr(&op.expr, depth)?;
                    f = Folded {
                        size: f.size.and(o.size).map(|_| 5),
                        cost: f.cost.saturating_add(o.cost),
                    };
                }
                Folded {
                    size: f.size,
                    cost: 16 + f.cost,
                }
            }
            Expr::Slice(x) => {
                self.expr(&x.expr, depth)?;
                for e in [&x.start, &x.stop, &x.step].into_iter().flatten() {
                    self.expr(e, depth)?;
                }
                not_const
            }
            Expr::IfExpr(x) => {
                self.expr(&x.test_expr, depth)?;
                self.expr(&x.true_expr, depth)?;
                if let Some(e) = &x.false_expr {
                    self.expr(e, depth)?;
                }
                not_const
            }
            Expr::Filter(x) => {
                if let Some(e) = &x.expr {
                    self.expr(e, depth)?;
                }
                self.args(&x.args, depth)?;
                not_const
            }
            Expr::Test(x) => {
                self.expr(&x.expr, depth)?;
                self.args(&x.args, depth)?;
                not_const
            }
            Expr::GetAttr(x) => {
                self.expr(&x.expr, depth)?;
                not_const
            }
            Expr::GetItem(x) => {
                self.expr(&x.expr, depth)?;
                self.expr(&x.subscript_expr, depth)?;
                not_const
            }
            Expr::Call(x) => {
                self.call(x, depth)?;
                not_const
            }
        };
        if let Some(size) = folded.size {
            if size > TEMPLATE_MAX_VALUE {
                return Err(refuse(format!(
                    "a constant expression of the template would exceed {} MiB",
                    TEMPLATE_MAX_VALUE >> 20
                )));
            }
        }
        self.add(folded.cost)?;
        Ok(folded)
    }
}
