//! The fleet vocabulary shared by the store benchmarks: realistic traffic draws its
//! `{intent, tool_call, status}` tuples from a small set.

pub const INTENTS: [&str; 4] = ["search", "plan", "execute", "summarize"];
pub const TOOLS: [&str; 8] = [
    "read_file",
    "write_file",
    "list_files",
    "run_shell",
    "grep",
    "http_get",
    "sql",
    "edit",
];
