//! Command lines shortened the way people read them.
//!
//! A GPU process is usually an interpreter running a script from a deep path:
//! `/opt/torch/.venv/bin/python3 /home/labuser/work/exp/train.py --lr 3e-4 ...`. Cut to its
//! first 40 characters, eleven such workloads all read `/opt/torch/.venv/bin/python3
//! /home/labu…`. [`abbreviate`] keeps what tells them apart, as nvitop and `ps` users read
//! them: the program's name without its directory, for an interpreter the script's file
//! name (or `-m module`, `-jar file.jar`, `-c …`), then as many arguments as fit, paths
//! among them shortened to `…/file` when that makes more fit, and `…` where the rest was
//! elided. A command line that fits is returned whole.
//!
//! One function for every place that shortens a command (`leaks`, `plot` legends, `ps`,
//! `status`, `top`, the exporter's `command` label), so they all agree; it escapes what
//! could act on a terminal ([`crate::untrusted`]) before it measures.

/// Marks what was elided.
pub const ELLIPSIS: char = '…';

/// Fewest characters of a script or module name worth showing beside its interpreter
/// (`trai…py`); with less room the whole head is elided instead.
const MIN_NAME_CHARS: usize = 8;

/// Fewest characters of an argument cut at its end worth showing (`--model-…`); with less
/// room the rest is a bare `…`.
const MIN_ARG_CHARS: usize = 6;

/// `command` in at most `max_chars` characters (see the module docs), escaped first
/// ([`crate::untrusted::escape`]: a command line is another user's text, and what this
/// returns is shown to people), so the width counts what the terminal shows.
pub fn abbreviate(command: &str, max_chars: usize) -> String {
    let escaped = crate::untrusted::escape(command.trim());
    let command: &str = &escaped;
    if chars(command) <= max_chars {
        return command.to_owned();
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    if words.first().is_some_and(|w| w.starts_with('[')) {
        // A kernel thread or a process without a command line (`[comm]`).
        return cut_end(command, max_chars);
    }
    let (head, rest) = split_head(&words);
    fit(&head, rest, max_chars)
}

/// Character count (the unit of every width here).
fn chars(text: &str) -> usize {
    text.chars().count()
}

/// The file name of a path: `/opt/venv/bin/python3` → `python3`.
fn base(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    trimmed
        .rsplit('/')
        .next()
        .filter(|b| !b.is_empty())
        .unwrap_or(path)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Python,
    Node,
    Ruby,
    Perl,
    Shell,
    Java,
    /// Interpreters whose first non-option word is the script and whose options take no
    /// separate value worth knowing (Rscript, julia, php, lua).
    Plain,
    Other,
}

fn kind_of(program: &str) -> Kind {
    let name = program.to_ascii_lowercase();
    let versioned = |stem: &str| {
        name.strip_prefix(stem)
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    };
    if versioned("python") || versioned("pypy") || name == "ipython" || name == "ipython3" {
        Kind::Python
    } else if matches!(name.as_str(), "node" | "nodejs" | "bun" | "deno") {
        Kind::Node
    } else if versioned("ruby") {
        Kind::Ruby
    } else if versioned("perl") {
        Kind::Perl
    } else if matches!(
        name.as_str(),
        "sh" | "bash" | "zsh" | "dash" | "ksh" | "fish" | "ash"
    ) {
        Kind::Shell
    } else if name == "java" {
        Kind::Java
    } else if matches!(
        name.as_str(),
        "rscript" | "julia" | "php" | "lua" | "luajit" | "tclsh"
    ) {
        Kind::Plain
    } else {
        Kind::Other
    }
}

/// Options of each interpreter that take the next word as their value.
fn takes_value(kind: Kind, option: &str) -> bool {
    match kind {
        Kind::Python => matches!(option, "-W" | "-X" | "-Q"),
        Kind::Node => matches!(
            option,
            "-r" | "--require" | "--loader" | "--import" | "--experimental-loader" | "--title"
        ),
        Kind::Ruby => matches!(option, "-I" | "-r"),
        Kind::Perl => matches!(option, "-I" | "-M" | "-m"),
        Kind::Java => matches!(
            option,
            "-cp" | "-classpath" | "--class-path" | "-p" | "--module-path" | "--add-opens"
        ),
        Kind::Shell | Kind::Plain | Kind::Other => false,
    }
}

/// What identifies the command, shortened (`python3 train.py`), and the arguments after.
fn split_head<'w, 's>(words: &'w [&'s str]) -> (Vec<String>, &'w [&'s str]) {
    let mut i = 0;
    // `env [-i] [-u NAME] NAME=VALUE ... program ...`: the program is what runs.
    if words.first().is_some_and(|w| base(w) == "env") {
        i = 1;
        while let Some(w) = words.get(i) {
            if *w == "-u" || *w == "--unset" {
                i += 2;
            } else if w.starts_with('-') || (w.contains('=') && !w.starts_with('=')) {
                i += 1;
            } else {
                break;
            }
        }
    }
    let Some(program) = words.get(i) else {
        return (words.iter().map(|w| (*w).to_owned()).collect(), &[]);
    };
    let program = base(program);
    let kind = kind_of(program);
    let mut head = vec![program.to_owned()];
    i += 1;
    if kind == Kind::Other {
        return (head, tail(words, i));
    }
    if kind == Kind::Node && matches!(program, "deno" | "bun") && words.get(i) == Some(&"run") {
        head.push("run".to_owned());
        i += 1;
    }
    while let Some(&word) = words.get(i) {
        if word == "--" {
            i += 1;
            continue;
        }
        if !word.starts_with('-') || word == "-" {
            // The script: its file name is what people know it by.
            head.push(base(word).to_owned());
            return (head, tail(words, i + 1));
        }
        match (kind, word) {
            // Code given inline: say so; the code itself is the rest.
            (Kind::Python, "-c")
            | (Kind::Node, "-e" | "--eval" | "-p" | "--print")
            | (Kind::Ruby | Kind::Perl, "-e" | "-E") => {
                head.push(word.to_owned());
                return (head, tail(words, i + 1));
            }
            (Kind::Shell, "-c") => {
                // A shell running a command line: that command, shortened the same way.
                head.push(word.to_owned());
                let inner = tail(words, i + 1);
                let (inner_head, inner_rest) = split_head(inner);
                head.extend(inner_head);
                return (head, inner_rest);
            }
            (Kind::Python, "-m") | (Kind::Java, "-jar") => {
                head.push(word.to_owned());
                if let Some(target) = words.get(i + 1) {
                    let target = if kind == Kind::Java {
                        base(target)
                    } else {
                        target
                    };
                    head.push(target.to_owned());
                }
                return (head, tail(words, i + 2));
            }
            (Kind::Python, w) if w.starts_with("-m") && w.len() > 2 => {
                head.push("-m".to_owned());
                head.push(w[2..].to_owned());
                return (head, tail(words, i + 1));
            }
            _ => {
                i += if takes_value(kind, word) { 2 } else { 1 };
            }
        }
    }
    (head, &[])
}

fn tail<'w, 's>(words: &'w [&'s str], from: usize) -> &'w [&'s str] {
    words.get(from..).unwrap_or(&[])
}

/// `head`, then as many of `rest` as fit, then `…` when some did not.
fn fit(head: &[String], rest: &[&str], max_chars: usize) -> String {
    let head_text = head.join(" ");
    if chars(&head_text) > max_chars {
        // Keep the program (and `-m`, `-jar`) whole and elide the middle of the script or
        // module name, while that leaves it a readable part.
        if let Some((last, first)) = head.split_last().filter(|(_, f)| !f.is_empty()) {
            let lead = first.join(" ");
            let room = max_chars.saturating_sub(chars(&lead) + 1);
            if room >= MIN_NAME_CHARS {
                return format!("{lead} {}", elide_middle(last, room));
            }
        }
        return elide_middle(&head_text, max_chars);
    }
    let whole = |args: &[String]| -> String {
        let mut out = head_text.clone();
        for a in args {
            out.push(' ');
            out.push_str(a);
        }
        out
    };
    let plain: Vec<String> = rest.iter().map(|a| (*a).to_owned()).collect();
    let full = whole(&plain);
    if chars(&full) <= max_chars {
        return full;
    }
    // Paths among the arguments as `…/file`: the file name is what tells runs apart.
    let short: Vec<String> = rest.iter().map(|a| short_path(a)).collect();
    let shortened = whole(&short);
    if chars(&shortened) <= max_chars {
        return shortened;
    }
    let mut out = head_text;
    let mut used = chars(&out);
    for arg in &short {
        // Room for the argument and, after it, ` …` for the rest.
        let needed = 1 + chars(arg) + 2;
        if used + needed > max_chars {
            // The first argument that does not fit: its beginning, when that is long
            // enough to read (`--model-…`).
            let room = max_chars.saturating_sub(used + 1);
            if room >= MIN_ARG_CHARS {
                // It does not fit with ` …` after it, so `…` ends it whatever its length.
                out.push(' ');
                out.extend(arg.chars().take(room - 1));
                out.push(ELLIPSIS);
                return out;
            }
            break;
        }
        out.push(' ');
        out.push_str(arg);
        used += 1 + chars(arg);
    }
    if used + 2 <= max_chars {
        out.push(' ');
        out.push(ELLIPSIS);
        out
    } else {
        // No room for ` …`: `…` at the end still says something was left out.
        if used < max_chars {
            out.push(ELLIPSIS);
            out
        } else {
            let mut cut: String = out.chars().take(max_chars.saturating_sub(1)).collect();
            cut.push(ELLIPSIS);
            cut
        }
    }
}

/// A path argument (`/a/b/c.yaml`, `--config=/a/b/c.yaml`) as `…/c.yaml`; anything else
/// as it is.
fn short_path(arg: &str) -> String {
    let (prefix, value) = match arg.split_once('=') {
        Some((k, v)) if k.starts_with('-') => (Some(k), v),
        _ => (None, arg),
    };
    let slashes = value.matches('/').count();
    let is_path = slashes >= 2 || (slashes == 1 && !value.starts_with('/'));
    if !is_path || value.contains("://") || chars(value) <= 16 {
        return arg.to_owned();
    }
    let short = format!("{ELLIPSIS}/{}", base(value));
    if chars(&short) >= chars(value) {
        return arg.to_owned();
    }
    match prefix {
        Some(k) => format!("{k}={short}"),
        None => short,
    }
}

/// `text` cut at the end to `max_chars`, `…` last.
fn cut_end(text: &str, max_chars: usize) -> String {
    if chars(text) <= max_chars {
        return text.to_owned();
    }
    if max_chars == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(max_chars - 1).collect();
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.push(ELLIPSIS);
    out
}

/// `text` with its middle replaced by `…`, keeping its end (a file name's extension).
fn elide_middle(text: &str, max_chars: usize) -> String {
    if chars(text) <= max_chars {
        return text.to_owned();
    }
    if max_chars < 5 {
        return cut_end(text, max_chars);
    }
    let keep = max_chars - 1;
    let tail_n = keep / 3;
    let head_n = keep - tail_n;
    let all: Vec<char> = text.chars().collect();
    let mut out: String = all[..head_n].iter().collect();
    out.push(ELLIPSIS);
    out.extend(&all[all.len() - tail_n..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(command line, what 40 characters show)`, from real GPU hosts' process lists.
    const AT_40: &[(&str, &str)] = &[
        // The issue's eleven workloads: the script names tell them apart now.
        (
            "/opt/torch/.venv/bin/python3 /home/labuser/work/vramctl/scripts/workloads/leak_graph.py",
            "python3 leak_graph.py",
        ),
        (
            "/opt/torch/.venv/bin/python3 /home/labuser/work/vramctl/scripts/workloads/idle_holder.py --gib 12",
            "python3 idle_holder.py --gib 12",
        ),
        (
            "/usr/bin/python3 -u /srv/jobs/2026-11/train.py --lr 3e-4 --batch-size 64 --epochs 90",
            "python3 train.py --lr 3e-4 --batch-size…",
        ),
        (
            "/opt/conda/envs/llm/bin/python -m torch.distributed.run --nproc_per_node=8 train.py",
            "python -m torch.distributed.run --nproc…",
        ),
        (
            "/opt/conda/envs/llm/bin/python -mvllm.entrypoints.openai.api_server --model x",
            "python -m vllm.entrypoints.ope…pi_server",
        ),
        (
            "/home/alice/.local/share/jupyter/kernels/py311/bin/python -m ipykernel_launcher -f /run/user/1000/jupyter/kernel-1c2d.json",
            "python -m ipykernel_launcher -f …/kerne…",
        ),
        (
            "/usr/local/bin/python3.11 -W ignore -X faulthandler /workspace/finetune/run_clm.py --model_name_or_path gpt2",
            "python3.11 run_clm.py --model_name_or_p…",
        ),
        (
            "/opt/venv/bin/python3 -c import torch; x = torch.zeros(1 << 30, device='cuda'); input()",
            "python3 -c import torch; x = torch.zero…",
        ),
        (
            "/usr/bin/env CUDA_VISIBLE_DEVICES=0 /opt/venv/bin/python /data/exp/eval_model.py --ckpt /data/exp/ckpt/step_120000.pt",
            "python eval_model.py --ckpt …/step_1200…",
        ),
        (
            "/bin/bash -c /opt/venv/bin/python /home/bob/projects/diffusion/sample.py --steps 50",
            "bash -c python sample.py --steps 50",
        ),
        (
            "/usr/lib/jvm/java-17-openjdk-amd64/bin/java -Xmx64g -cp /opt/spark/jars/* -jar /opt/rapids/rapids-4-spark_2.12-24.08.1.jar",
            "java -jar rapids-4-spark_2.12-….08.1.jar",
        ),
        (
            "/usr/lib/jvm/java-17/bin/java -Dspark.master=local -cp /opt/spark/conf:/opt/spark/jars/* org.apache.spark.deploy.SparkSubmit",
            "java org.apache.spark.deploy.SparkSubmit",
        ),
        (
            "/home/carol/.nvm/versions/node/v20.11.0/bin/node --require ./tracing.js /srv/app/dist/server.js --port 8080",
            "node server.js --port 8080",
        ),
        (
            "/usr/bin/ruby -I lib /home/dave/ml/bin/infer.rb --device cuda:0",
            "ruby infer.rb --device cuda:0",
        ),
        (
            "/usr/bin/perl -I /opt/lib /opt/tools/gpu-burn-wrapper.pl --minutes 60",
            "perl gpu-burn-wrapper.pl --minutes 60",
        ),
        (
            "/opt/ollama/bin/ollama runner --model /root/.ollama/models/blobs/sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa --ctx-size 8192",
            "ollama runner --model …/sha256-6a0746a1…",
        ),
        (
            "/usr/local/bin/torchrun --nproc_per_node 8 --master_port 29500 /workspace/megatron/pretrain_gpt.py",
            "torchrun --nproc_per_node 8 --master_po…",
        ),
        (
            "/usr/bin/Rscript --vanilla /home/erin/analysis/gpu_glm_fit_with_very_long_name.R",
            "Rscript gpu_glm_fit_with_very…ong_name.R",
        ),
        // Short enough: whole, path and all.
        ("/usr/bin/python3 train.py", "/usr/bin/python3 train.py"),
        ("python train.py --bf16", "python train.py --bf16"),
        // Kernel threads and nameless processes keep their brackets.
        (
            "[kworker/u256:3-events_unbound_with_a_long_tail]",
            "[kworker/u256:3-events_unbound_with_a_l…",
        ),
    ];

    #[test]
    fn command_lines_read_as_interpreter_and_script_first() {
        for (command, want) in AT_40 {
            let got = abbreviate(command, 40);
            assert_eq!(&got, want, "{command}");
            assert!(chars(&got) <= 40, "{got}");
        }
    }

    #[test]
    fn nothing_is_ever_longer_than_asked() {
        for (command, _) in AT_40 {
            for max in 0..=90 {
                let got = abbreviate(command, max);
                assert!(chars(&got) <= max, "{max}: {got:?} from {command}");
                if chars(command) <= max {
                    assert_eq!(got, command.trim());
                }
            }
        }
    }

    #[test]
    fn a_script_name_too_long_for_the_room_keeps_its_end() {
        let got = abbreviate(
            "/opt/venv/bin/python /x/a_script_with_an_extremely_long_descriptive_name.py",
            24,
        );
        assert_eq!(got, "python a_script_wi…me.py");
        assert_eq!(abbreviate("", 10), "");
        assert_eq!(abbreviate("   ", 10), "");
        assert_eq!(abbreviate("/bin/true", 3), "tr…");
        // Arguments left out are marked even without room for ` …`.
        assert_eq!(
            abbreviate("/usr/bin/python3 train.py --lr 3e-4", 16),
            "python3 train.p…"
        );
        assert_eq!(
            abbreviate("/usr/bin/python train.py --lr 3e-4", 16),
            "python train.py…"
        );
    }

    #[test]
    fn a_command_line_is_escaped_before_it_is_measured() {
        let forged = "/usr/bin/python3 train.py \x1b[2K\rKill 0 processes? [y/N]\u{202e}";
        assert_eq!(
            abbreviate(forged, 200),
            "/usr/bin/python3 train.py \\u{1b}[2K\\rKill 0 processes? [y/N]\\u{202e}"
        );
        for max in 0..=80 {
            let got = abbreviate(forged, max);
            assert!(chars(&got) <= max, "{max}: {got:?}");
            assert!(
                !got.chars().any(crate::untrusted::needs_escape),
                "{max}: {got:?}"
            );
        }
        // A forged line end is no word break: it stays inside the word it was in.
        assert_eq!(abbreviate("/bin/sleep 1\nforged", 12), "sleep 1\\nfo…");
    }

    #[test]
    fn interpreters_are_recognised_by_name_and_version() {
        for name in ["python", "python3", "python3.12", "pypy3", "ipython"] {
            assert_eq!(kind_of(name), Kind::Python, "{name}");
        }
        assert_eq!(kind_of("pythonista"), Kind::Other);
        assert_eq!(kind_of("node"), Kind::Node);
        assert_eq!(kind_of("bash"), Kind::Shell);
        assert_eq!(kind_of("java"), Kind::Java);
        assert_eq!(kind_of("ruby3.2"), Kind::Ruby);
        assert_eq!(kind_of("torchrun"), Kind::Other);
    }

    #[test]
    fn paths_shorten_to_their_file_name() {
        assert_eq!(
            short_path("/data/exp/ckpt/step_120000.pt"),
            "…/step_120000.pt"
        );
        assert_eq!(
            short_path("--config=/etc/jobs/a/b.yaml"),
            "--config=…/b.yaml"
        );
        assert_eq!(
            short_path("https://example.com/a/b/c"),
            "https://example.com/a/b/c"
        );
        assert_eq!(short_path("3e-4"), "3e-4");
        assert_eq!(short_path("/a/b"), "/a/b");
    }
}
