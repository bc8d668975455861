//! History paging (live): asking the history store for the charts' past, the part of the
//! zoom window from before `top`'s first sample. What `top` samples from then on is its
//! own, so the store is asked once, and again only when a zoom reaches further back.
//! The answer ([`Event::History`](crate::event::Event::History)) goes to the charts.

use super::effect::{Effect, Reply};
use crate::event::HistoryRequest;
use crate::replay::keys_of;
use vramctl_observe::observation::Observation;

/// Points per series asked for, as many as `top` asks of a replay frame (`cmd/top.rs`).
const MAX_POINTS: usize = 512;

/// What history paging reacts to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PagingEvent<'a> {
    /// A live sample is on screen.
    Sampled {
        /// The sample.
        obs: &'a Observation,
        /// The charts' span now.
        span_ms: i64,
    },
    /// The charts' span changed (a zoom).
    Zoomed {
        /// The observation on screen, if any yet.
        latest: Option<&'a Observation>,
        /// The new span.
        span_ms: i64,
    },
}

/// Where the charts' older past stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPaging {
    /// A history source is wired (the recorder's database is there).
    wired: bool,
    /// Time of the first sample `top` took: older history is asked for up to it.
    first_sample_ms: Option<i64>,
    /// How far back the history asked for reaches.
    from_ms: Option<i64>,
}

impl HistoryPaging {
    /// Paging over a history source when `wired`; without one it never asks.
    pub fn new(wired: bool) -> Self {
        Self {
            wired,
            first_sample_ms: None,
            from_ms: None,
        }
    }

    /// Whether a history source is wired: the charts reach back before `top` started.
    pub fn wired(&self) -> bool {
        self.wired
    }

    /// Takes in one event; asks for the history the charts' window now needs.
    pub fn update(&mut self, event: PagingEvent<'_>) -> Reply {
        let (latest, span_ms) = match event {
            PagingEvent::Sampled { obs, span_ms } => {
                self.first_sample_ms.get_or_insert(obs.taken_at_unix_ms());
                (Some(obs), span_ms)
            }
            PagingEvent::Zoomed { latest, span_ms } => (latest, span_ms),
        };
        Reply::effects(self.request(latest, span_ms).into_iter().collect())
    }

    /// The window before `top`'s first sample that the chart window ending at `latest`
    /// needs and that was not asked for yet.
    fn request(&mut self, latest: Option<&Observation>, span_ms: i64) -> Option<Effect> {
        if !self.wired {
            return None;
        }
        let (Some(obs), Some(first)) = (latest, self.first_sample_ms) else {
            return None;
        };
        let from = obs.taken_at_unix_ms() - span_ms;
        if from >= first || self.from_ms.is_some_and(|f| f <= from) {
            return None;
        }
        self.from_ms = Some(from);
        Some(Effect::LoadHistory(HistoryRequest {
            keys: keys_of(obs),
            starts: obs.starts(),
            from_ms: from,
            to_ms: first,
            max_points: MAX_POINTS,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{GIB, T0_MS, gpu, host, obs};
    use crate::memory_series::Zoom;

    fn at(t_s: i64) -> std::sync::Arc<Observation> {
        obs(
            t_s,
            vec![gpu(0, 140 * GIB, GIB, &[(101, GIB)])],
            vec![host(101, 1, "alice", "python train.py")],
        )
    }

    fn sampled(paging: &mut HistoryPaging, t_s: i64, zoom: Zoom) -> Vec<Effect> {
        let o = at(t_s);
        paging
            .update(PagingEvent::Sampled {
                obs: &o,
                span_ms: zoom.span_ms(),
            })
            .effects
    }

    #[test]
    fn the_first_sample_asks_for_the_window_before_it_once() {
        let mut paging = HistoryPaging::new(true);
        let effects = sampled(&mut paging, 600, Zoom::FiveMinutes);
        let [Effect::LoadHistory(request)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        let first = T0_MS + 600_000;
        assert_eq!(request.to_ms, first);
        assert_eq!(request.from_ms, first - Zoom::FiveMinutes.span_ms());
        assert_eq!(request.starts.get(&101), Some(&1010), "by identity");
        assert!(request.keys.len() >= 2, "the GPU and its process");
        assert!(sampled(&mut paging, 601, Zoom::FiveMinutes).is_empty());
        assert!(sampled(&mut paging, 900, Zoom::FiveMinutes).is_empty());
    }

    #[test]
    fn a_zoom_out_asks_again_up_to_the_first_sample_and_a_zoom_in_does_not() {
        let mut paging = HistoryPaging::new(true);
        let _ = sampled(&mut paging, 600, Zoom::FiveMinutes);
        let now = at(700);
        let zoomed = |paging: &mut HistoryPaging, zoom: Zoom| {
            paging
                .update(PagingEvent::Zoomed {
                    latest: Some(&now),
                    span_ms: zoom.span_ms(),
                })
                .effects
        };
        let effects = zoomed(&mut paging, Zoom::FifteenMinutes);
        let [Effect::LoadHistory(request)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(request.to_ms, T0_MS + 600_000);
        assert_eq!(
            request.from_ms,
            T0_MS + 700_000 - Zoom::FifteenMinutes.span_ms()
        );
        assert!(zoomed(&mut paging, Zoom::FiveMinutes).is_empty());
        // Nothing on screen yet: nothing to ask for.
        let mut fresh = HistoryPaging::new(true);
        let effects = fresh
            .update(PagingEvent::Zoomed {
                latest: None,
                span_ms: Zoom::Day.span_ms(),
            })
            .effects;
        assert!(effects.is_empty());
    }

    #[test]
    fn a_window_the_own_samples_cover_needs_nothing() {
        let mut paging = HistoryPaging::new(true);
        assert_eq!(sampled(&mut paging, 0, Zoom::Minute).len(), 1);
        assert!(sampled(&mut paging, 61, Zoom::Minute).is_empty());
    }

    #[test]
    fn without_a_source_it_never_asks() {
        let mut paging = HistoryPaging::new(false);
        assert!(sampled(&mut paging, 0, Zoom::Day).is_empty());
        assert!(!paging.wired());
    }
}
