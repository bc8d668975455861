//! The terminal, always given back: raw mode, the alternate screen and mouse capture are
//! undone when the [`TerminalGuard`] drops (normal exit and `?` errors) and by a panic
//! hook (a panic on any thread), whichever comes first; undoing twice is harmless.
//! Termination signals become an event that ends the loop (`event::spawn_signals`).

use std::io::{Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

/// Whether the terminal is in the UI's modes now.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Holds the terminal in the UI's modes; restores it on drop.
#[derive(Debug)]
pub struct TerminalGuard {
    _private: (),
}

impl TerminalGuard {
    /// Enters raw mode, the alternate screen and mouse capture, and installs the panic
    /// hook. On failure, whatever was entered is undone.
    ///
    /// # Errors
    /// When the terminal refuses a mode.
    pub fn enter() -> std::io::Result<(Self, Terminal<CrosstermBackend<Stdout>>)> {
        install_panic_hook();
        ACTIVE.store(true, Ordering::SeqCst);
        let guard = Self { _private: () };
        enable_raw_mode()?;
        let mut stdout = std::io::stdout();
        execute!(stdout, EnterAlternateScreen, EnableMouseCapture)?;
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        Ok((guard, terminal))
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves the UI's modes, once.
pub fn restore() {
    if !ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    let mut stdout = std::io::stdout();
    // Each step on its own: one failing must not keep the others from running.
    let _ = execute!(stdout, DisableMouseCapture);
    let _ = execute!(stdout, LeaveAlternateScreen);
    let _ = execute!(stdout, Show);
    let _ = disable_raw_mode();
    let _ = stdout.flush();
}

fn install_panic_hook() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Give the terminal back first, so the message is readable and the shell usable.
        let was_active = ACTIVE.load(Ordering::SeqCst);
        restore();
        previous(info);
        // A panic on a helper thread (sampler, input, actions) would leave the UI thread
        // drawing on a terminal that is no longer in raw mode: end the whole program.
        if was_active && std::thread::current().name() != Some("main") {
            std::process::exit(101);
        }
    }));
}
