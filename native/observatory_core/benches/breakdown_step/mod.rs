//! The action of step `i` of `bench/ingest_breakdown.exs`'s three sizes (small, 600 B,
//! 4 KiB), as canonical JSON: the Rust benches of the parse and of the verdict keys
//! time the same steps.

use crate::fleet::TOOLS;

const LINE: &str =
    "  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n";

/// Step `i`'s session (of 1,000) and round.
pub fn session_and_round(i: usize) -> (usize, usize) {
    (i % 1000, i / 1000)
}

/// Step `i`'s tool: a session changes tools from one round to the next.
pub fn tool(i: usize) -> &'static str {
    let (s, k) = session_and_round(i);
    TOOLS[(k * 3 + s) % 8]
}

/// Step `i`'s status: every fifth round fails.
pub fn status(i: usize) -> &'static str {
    if session_and_round(i).1 % 5 == 4 {
        "failure"
    } else {
        "success"
    }
}

/// Step `i`'s tool input: a file of the round.
pub fn input(i: usize) -> String {
    let k = session_and_round(i).1;
    format!(r#"{{"limit":200,"path":"/srv/app/lib/app/file_{k}.ex"}}"#)
}

/// Step `i`'s result of a size: a number and a tag (small), or a file read back with 3
/// (600 B) or 42 (4 KiB) lines of code.
pub fn result(size: &str, i: usize) -> String {
    let step_id = format!("r1-{i}");
    let json_str = |text: &str| serde_json::to_string(text).unwrap();
    match size {
        "small" => format!(r#"{{"bytes":{},"etag":"{step_id}"}}"#, 1024 + i),
        "600 B" => format!(
            r#"{{"content":{},"lines":4}}"#,
            json_str(&format!("# {step_id}\n{}", LINE.repeat(3)))
        ),
        _ => format!(
            r#"{{"content":{},"lines":43}}"#,
            json_str(&format!("# {step_id}\n{}", LINE.repeat(42)))
        ),
    }
}

/// The three sizes, in the tables' column order.
pub const SIZES: [&str; 3] = ["small", "600 B", "4 KiB"];

/// The median of a row's batch times.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The table's head: a stage column, then one column a size.
pub fn print_head() {
    print!("{:<32}", "stage");
    for size in SIZES {
        print!("{size:>10}");
    }
    println!();
}

/// The table's rows: each stage's name and its ns a call at each size.
pub fn print_rows<'a>(names: impl Iterator<Item = &'a str>, table: &[Vec<f64>]) {
    for (name, row) in names.zip(table) {
        print!("{name:<32}");
        for x in row {
            print!("{x:>10.0}");
        }
        println!();
    }
}
