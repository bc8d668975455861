//! The replay transport: the cursor, play and pause, speed and seeks of `top --replay`.
//!
//! The transport never holds an observation: it asks the replay thread for one
//! ([`Effect::Seek`]), and when the frame comes back it says whether the series go on from
//! the previous frame ([`Transport::continues`]); the App puts the frame on screen.
//! Playing counts [`TICK_MS`] of wall time per [`TransportEvent::Tick`], never a clock.

use ratatui::crossterm::event::KeyCode;

use super::effect::{Effect, Reply};
use crate::replay::Seek;

/// Time a tick stands for while a replay plays.
pub const TICK_MS: i64 = 200;
/// Replay speeds, in recorded seconds per second.
pub const SPEEDS: [u32; 8] = [1, 2, 5, 10, 30, 60, 300, 600];
/// Seek keys kept while a seek is outstanding (a held arrow key repeats ~30 times a
/// second; more than this are dropped, and said to be).
pub const MAX_QUEUED_KEYS: usize = 64;

/// What the transport reacts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportEvent {
    /// `top` starts: go to the recording's first sample.
    Start,
    /// [`TICK_MS`] passed.
    Tick,
    /// A key; `now_ms` is the time on screen (the cursor), if a frame is there.
    Key {
        /// The key.
        code: KeyCode,
        /// The time on screen.
        now_ms: Option<i64>,
    },
    /// The replay thread answered `seek`.
    Frame {
        /// What was asked.
        seek: Seek,
        /// The recording's first and last sample times.
        range: Option<(i64, i64)>,
        /// When the frame's observation was taken; `None` past either end.
        frame_ms: Option<i64>,
        /// The time on screen before this frame, if any.
        now_ms: Option<i64>,
    },
    /// The replay thread could not read the recording.
    Failed(String),
    /// The charts' window changed: the frame on screen is asked for again with it.
    Reload {
        /// The time on screen.
        now_ms: Option<i64>,
    },
}

/// The replay cursor and player.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transport {
    /// The recording's first and last sample times.
    pub range: Option<(i64, i64)>,
    /// Playing forward.
    pub playing: bool,
    /// Index into [`SPEEDS`].
    pub speed: usize,
    /// Where the player is (between samples).
    pub play_ms: Option<i64>,
    /// A seek is outstanding.
    pub waiting: bool,
    /// Seek keys pressed while a seek was outstanding, oldest first: each is carried out
    /// from the frame the one before it brings. A seek is relative to the cursor, which
    /// moves only when its frame comes back, so keys sent in a burst (`→→→`) would
    /// otherwise all ask for the same frame and move the cursor once (issue 29).
    pub queued: std::collections::VecDeque<KeyCode>,
}

impl Transport {
    /// Recorded seconds per second.
    pub fn speed(&self) -> u32 {
        SPEEDS[self.speed.min(SPEEDS.len() - 1)]
    }

    /// Whether a frame answering `seek` follows the one on screen (a step forward, or
    /// playing), so the charts' series go on instead of starting afresh.
    pub fn continues(&self, seek: Seek) -> bool {
        matches!(seek, Seek::After(_)) || self.playing
    }

    /// Takes in one event; returns the seeks to make and what to say.
    pub fn update(&mut self, event: TransportEvent) -> Reply {
        match event {
            TransportEvent::Start => self.seek(Seek::After(i64::MIN)),
            TransportEvent::Tick => self.tick(),
            TransportEvent::Key { code, now_ms } => self.key(code, now_ms),
            TransportEvent::Frame {
                seek,
                range,
                frame_ms,
                now_ms,
            } => self.frame(seek, range, frame_ms, now_ms),
            TransportEvent::Failed(reason) => {
                self.waiting = false;
                self.playing = false;
                self.queued.clear();
                Reply::say(format!("cannot read the recording: {reason}"))
            }
            TransportEvent::Reload { now_ms } => match now_ms {
                Some(now) => self.seek(Seek::AtOrBefore(now)),
                None => Reply::done(),
            },
        }
    }

    fn seek(&mut self, seek: Seek) -> Reply {
        self.waiting = true;
        Reply::effects(vec![Effect::Seek(seek)])
    }

    fn frame(
        &mut self,
        seek: Seek,
        range: Option<(i64, i64)>,
        frame_ms: Option<i64>,
        now_ms: Option<i64>,
    ) -> Reply {
        self.waiting = false;
        self.range = range;
        let Some(t) = frame_ms else {
            // Past either end: the rest of a burst would only say so again.
            self.queued.clear();
            self.playing = false;
            let had_frame = now_ms.is_some();
            return Reply::say(match seek {
                Seek::After(_) if had_frame => "end of the recording",
                Seek::Before(_) | Seek::AtOrBefore(_) if had_frame => "start of the recording",
                _ => "the recording is empty",
            });
        };
        // The same moment again (a zoom) leaves the player where it is; a paused player
        // moves to the frame shown.
        if now_ms != Some(t) && !self.playing {
            self.play_ms = Some(t);
        }
        // The next key of a burst, from the cursor this frame puts on screen.
        match self.queued.pop_front() {
            Some(code) => self.key(code, Some(t)),
            None => Reply::done(),
        }
    }

    fn tick(&mut self) -> Reply {
        if !self.playing {
            return Reply::done();
        }
        let speed = i64::from(self.speed());
        let play = self
            .play_ms
            .unwrap_or(i64::MIN)
            .saturating_add(TICK_MS * speed);
        self.play_ms = Some(play);
        if let Some((_, end)) = self.range {
            if play > end {
                self.playing = false;
                self.play_ms = Some(end);
                return Reply::say("end of the recording");
            }
        }
        if self.waiting {
            return Reply::done();
        }
        self.seek(Seek::AtOrBefore(play))
    }

    fn key(&mut self, code: KeyCode, now_ms: Option<i64>) -> Reply {
        let cursor = now_ms.or(self.range.map(|(a, _)| a)).unwrap_or(0);
        let seek = match code {
            KeyCode::Char(' ') => {
                self.playing = !self.playing;
                self.play_ms = Some(cursor);
                return Reply::done();
            }
            KeyCode::Char('+' | '=') => {
                self.speed = (self.speed + 1).min(SPEEDS.len() - 1);
                return Reply::done();
            }
            KeyCode::Char('-' | '_') => {
                self.speed = self.speed.saturating_sub(1);
                return Reply::done();
            }
            KeyCode::Right => Seek::After(cursor),
            KeyCode::Left => Seek::Before(cursor),
            KeyCode::Char(']') => Seek::AtOrBefore(cursor.saturating_add(60_000)),
            KeyCode::Char('[') => Seek::Before(cursor.saturating_sub(60_000).saturating_add(1)),
            KeyCode::Char('}') => Seek::AtOrBefore(cursor.saturating_add(600_000)),
            KeyCode::Char('{') => Seek::Before(cursor.saturating_sub(600_000).saturating_add(1)),
            KeyCode::Char('b') => Seek::After(i64::MIN),
            KeyCode::Char('e') => Seek::AtOrBefore(i64::MAX),
            _ => return Reply::ignored(),
        };
        self.playing = false;
        if self.waiting {
            if self.queued.len() >= MAX_QUEUED_KEYS {
                return Reply::say("too many keys at once: some were dropped");
            }
            self.queued.push_back(code);
            return Reply::done();
        }
        self.seek(seek)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_000_000;

    fn key(t: &mut Transport, code: KeyCode, now_ms: i64) -> Reply {
        t.update(TransportEvent::Key {
            code,
            now_ms: Some(now_ms),
        })
    }

    fn seeks(reply: &Reply) -> Vec<Seek> {
        reply
            .effects
            .iter()
            .map(|e| match e {
                Effect::Seek(s) => *s,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// The frame at `t` answering `seek`, in a recording from `T` to `T + 100 s`.
    fn frame(t: &mut Transport, seek: Seek, frame_ms: Option<i64>, now_ms: Option<i64>) -> Reply {
        t.update(TransportEvent::Frame {
            seek,
            range: Some((T, T + 100_000)),
            frame_ms,
            now_ms,
        })
    }

    #[test]
    fn start_asks_for_the_first_sample() {
        let mut t = Transport::default();
        let reply = t.update(TransportEvent::Start);
        assert_eq!(seeks(&reply), [Seek::After(i64::MIN)]);
        assert!(t.waiting);
        let reply = frame(&mut t, Seek::After(i64::MIN), Some(T), None);
        assert_eq!(reply, Reply::done());
        assert!(!t.waiting);
        assert_eq!((t.range, t.play_ms), (Some((T, T + 100_000)), Some(T)));
    }

    #[test]
    fn keys_seek_from_the_cursor_and_pause() {
        let mut t = Transport {
            playing: true,
            ..Transport::default()
        };
        let cases = [
            (KeyCode::Right, Seek::After(T)),
            (KeyCode::Left, Seek::Before(T)),
            (KeyCode::Char(']'), Seek::AtOrBefore(T + 60_000)),
            (KeyCode::Char('['), Seek::Before(T - 60_000 + 1)),
            (KeyCode::Char('}'), Seek::AtOrBefore(T + 600_000)),
            (KeyCode::Char('{'), Seek::Before(T - 600_000 + 1)),
            (KeyCode::Char('b'), Seek::After(i64::MIN)),
            (KeyCode::Char('e'), Seek::AtOrBefore(i64::MAX)),
        ];
        for (code, seek) in cases {
            t.playing = true;
            // Each as the first key after a frame (a key while a seek is outstanding waits
            // for its frame: the test below).
            t.waiting = false;
            assert_eq!(seeks(&key(&mut t, code, T)), [seek], "{code:?}");
            assert!(!t.playing && t.waiting, "{code:?}");
        }
        // Without a frame on screen, the cursor is the recording's start.
        t.range = Some((T, T + 100_000));
        t.waiting = false;
        let reply = t.update(TransportEvent::Key {
            code: KeyCode::Right,
            now_ms: None,
        });
        assert_eq!(seeks(&reply), [Seek::After(T)]);
        // Not a transport key: the App offers it to the others.
        assert!(key(&mut t, KeyCode::Char('s'), T).ignored);
        assert!(key(&mut t, KeyCode::Down, T).ignored);
    }

    #[test]
    fn keys_sent_in_a_burst_are_each_carried_out_from_the_frame_before() {
        // Issue 29: `→→→` sent at once moved the cursor once — each seek asked for the
        // sample after the same cursor, which only moves when a frame comes back.
        let mut t = Transport {
            range: Some((T, T + 100_000)),
            ..Transport::default()
        };
        assert_eq!(seeks(&key(&mut t, KeyCode::Right, T)), [Seek::After(T)]);
        for code in [KeyCode::Right, KeyCode::Right, KeyCode::Char(']')] {
            assert_eq!(key(&mut t, code, T), Reply::done(), "queued, not sent");
        }
        // Each frame brings the next key's seek, from the frame's own time.
        let reply = frame(&mut t, Seek::After(T), Some(T + 1_000), Some(T));
        assert_eq!(seeks(&reply), [Seek::After(T + 1_000)]);
        let reply = frame(
            &mut t,
            Seek::After(T + 1_000),
            Some(T + 2_000),
            Some(T + 1_000),
        );
        assert_eq!(seeks(&reply), [Seek::After(T + 2_000)]);
        let reply = frame(
            &mut t,
            Seek::After(T + 2_000),
            Some(T + 3_000),
            Some(T + 2_000),
        );
        assert_eq!(seeks(&reply), [Seek::AtOrBefore(T + 63_000)]);
        let reply = frame(
            &mut t,
            Seek::AtOrBefore(T + 63_000),
            Some(T + 63_000),
            Some(T + 3_000),
        );
        assert_eq!(reply, Reply::done());
        assert!(!t.waiting && t.queued.is_empty());
        // Past the end, the rest of a burst is dropped with the one message.
        let _ = key(&mut t, KeyCode::Right, T + 100_000);
        let _ = key(&mut t, KeyCode::Right, T + 100_000);
        let reply = frame(&mut t, Seek::After(T + 100_000), None, Some(T + 100_000));
        assert_eq!(reply.message.as_deref(), Some("end of the recording"));
        assert!(seeks(&reply).is_empty() && t.queued.is_empty());
        // A burst longer than the queue says that keys were dropped.
        let _ = key(&mut t, KeyCode::Left, T);
        for _ in 0..MAX_QUEUED_KEYS {
            assert_eq!(key(&mut t, KeyCode::Left, T), Reply::done());
        }
        assert!(key(&mut t, KeyCode::Left, T).message.is_some());
    }

    #[test]
    fn speed_steps_stop_at_either_end() {
        let mut t = Transport::default();
        assert_eq!(t.speed(), 1);
        for _ in 0..3 {
            assert_eq!(key(&mut t, KeyCode::Char('+'), T), Reply::done());
        }
        assert_eq!(t.speed(), 10);
        for _ in 0..20 {
            let _ = key(&mut t, KeyCode::Char('='), T);
        }
        assert_eq!(t.speed(), 600);
        for _ in 0..20 {
            let _ = key(&mut t, KeyCode::Char('-'), T);
        }
        assert_eq!(t.speed(), 1);
    }

    #[test]
    fn playing_advances_by_tick_times_speed_one_seek_at_a_time() {
        let mut t = Transport {
            range: Some((T, T + 100_000)),
            speed: 3,
            ..Transport::default()
        };
        assert_eq!(t.update(TransportEvent::Tick), Reply::done(), "paused");
        let _ = key(&mut t, KeyCode::Char(' '), T);
        assert!(t.playing);
        // 10× speed: a tick is 2 recorded seconds.
        let reply = t.update(TransportEvent::Tick);
        assert_eq!(seeks(&reply), [Seek::AtOrBefore(T + 2_000)]);
        // The answer has not come: the player moves on but asks nothing more.
        assert_eq!(t.update(TransportEvent::Tick), Reply::done());
        assert_eq!(t.play_ms, Some(T + 4_000));
        let reply = frame(&mut t, Seek::AtOrBefore(T + 2_000), Some(T), Some(T));
        assert_eq!(reply, Reply::done());
        assert_eq!(
            t.play_ms,
            Some(T + 4_000),
            "playing: the frame does not move it"
        );
        assert!(t.continues(Seek::AtOrBefore(T + 2_000)));
        let reply = t.update(TransportEvent::Tick);
        assert_eq!(seeks(&reply), [Seek::AtOrBefore(T + 6_000)]);
        // Past the end: it stops there.
        t.waiting = false;
        for _ in 0..100 {
            let _ = t.update(TransportEvent::Tick);
            t.waiting = false;
        }
        assert!(!t.playing);
        assert_eq!(t.play_ms, Some(T + 100_000));
    }

    #[test]
    fn the_end_of_the_recording_is_said_once() {
        let mut t = Transport {
            range: Some((T, T + 1_000)),
            playing: true,
            speed: 7,
            play_ms: Some(T),
            waiting: false,
            queued: std::collections::VecDeque::new(),
        };
        assert_eq!(
            t.update(TransportEvent::Tick).message.as_deref(),
            Some("end of the recording")
        );
        assert_eq!(t.update(TransportEvent::Tick), Reply::done());
    }

    #[test]
    fn a_frame_past_either_end_stops_and_says_which() {
        let mut t = Transport::default();
        let cases = [
            (Seek::After(T), Some(T), "end of the recording"),
            (Seek::Before(T), Some(T), "start of the recording"),
            (Seek::AtOrBefore(T), Some(T), "start of the recording"),
            (Seek::After(i64::MIN), None, "the recording is empty"),
            (Seek::AtOrBefore(T), None, "the recording is empty"),
        ];
        for (seek, now, said) in cases {
            t.playing = true;
            t.waiting = true;
            let reply = frame(&mut t, seek, None, now);
            assert_eq!(reply.message.as_deref(), Some(said), "{seek:?}");
            assert!(!t.playing && !t.waiting);
        }
    }

    #[test]
    fn only_a_step_forward_or_playing_continues_the_series() {
        let mut t = Transport::default();
        assert!(t.continues(Seek::After(T)));
        assert!(!t.continues(Seek::Before(T)));
        assert!(!t.continues(Seek::AtOrBefore(T)));
        t.playing = true;
        assert!(t.continues(Seek::Before(T)));
    }

    #[test]
    fn a_failed_read_stops_the_player_and_says_why() {
        let mut t = Transport {
            playing: true,
            waiting: true,
            ..Transport::default()
        };
        let reply = t.update(TransportEvent::Failed("disk I/O error".into()));
        assert_eq!(
            reply.message.as_deref(),
            Some("cannot read the recording: disk I/O error")
        );
        assert!(!t.playing && !t.waiting);
    }

    #[test]
    fn a_reload_asks_for_the_moment_on_screen_again() {
        let mut t = Transport::default();
        let reply = t.update(TransportEvent::Reload { now_ms: Some(T) });
        assert_eq!(seeks(&reply), [Seek::AtOrBefore(T)]);
        assert!(t.waiting);
        let mut empty = Transport::default();
        assert_eq!(
            empty.update(TransportEvent::Reload { now_ms: None }),
            Reply::done()
        );
        assert!(!empty.waiting);
    }
}
