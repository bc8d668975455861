//! The charts' state: the zoom (how far back they reach), the series `top` sampled itself,
//! and the older past loaded for them (from the store live, from the recording in a
//! replay). Asking for that past is the job of the live history paging or, in a replay,
//! of the transport; the charts only keep what is drawn, so their `update` asks nothing
//! of the loop.

use crate::memory_series::{
    HistoryChunk, Point, SeriesKey, SeriesSet, Starts, Zoom, change_per_minute, joined,
};
use vramctl_observe::observation::Observation;

/// The span the table's Δ/MIN column looks back over.
const DELTA_SPAN_MS: i64 = 60_000;

/// What the charts react to.
#[derive(Debug, Clone, PartialEq)]
pub enum ChartsEvent<'a> {
    /// A new moment on screen. `contiguous`: it follows the previous one (live, or a
    /// replay stepping forward or playing), so the series go on; otherwise they start
    /// afresh.
    Observed {
        /// The observation.
        obs: &'a Observation,
        /// It follows the previous one.
        contiguous: bool,
    },
    /// Older history arrived: the history loader's, or a replay frame's window.
    Loaded(HistoryChunk),
    /// Zoom in one step (`z`).
    ZoomIn,
    /// Zoom out one step (`Z`).
    ZoomOut,
}

/// The charts.
#[derive(Debug, Clone)]
pub struct Charts {
    /// Chart span.
    pub zoom: Zoom,
    /// What `top` sampled itself.
    pub series: SeriesSet,
    /// Older history (store or recording).
    pub loaded: Option<HistoryChunk>,
    /// Who each PID on screen is (start time), to match loaded history by identity.
    starts: Starts,
}

impl Default for Charts {
    fn default() -> Self {
        Self {
            zoom: Zoom::FiveMinutes,
            series: SeriesSet::default(),
            loaded: None,
            starts: Starts::new(),
        }
    }
}

impl Charts {
    /// Takes in one event.
    pub fn update(&mut self, event: ChartsEvent<'_>) {
        match event {
            ChartsEvent::Observed { obs, contiguous } => {
                if !contiguous {
                    self.series.clear();
                }
                self.series.record(obs);
                self.starts = obs.starts();
            }
            ChartsEvent::Loaded(chunk) => self.loaded = Some(chunk),
            ChartsEvent::ZoomIn => self.zoom = self.zoom.zoom_in(),
            ChartsEvent::ZoomOut => self.zoom = self.zoom.zoom_out(),
        }
    }

    /// Points of `key` over `[from_ms, to_ms]`: what was loaded before `top`'s own.
    pub fn points_between(&self, key: &SeriesKey, from_ms: i64, to_ms: i64) -> Vec<Point> {
        joined(
            self.series.get(key),
            self.loaded.as_ref(),
            &self.starts,
            key,
            from_ms,
            to_ms,
        )
    }

    /// Points of `key` over the zoom window ending at `now_ms`.
    pub fn points(&self, key: &SeriesKey, now_ms: i64) -> Vec<Point> {
        self.points_between(key, now_ms - self.zoom.span_ms(), now_ms)
    }

    /// The change of `key` over the minute up to `now_ms`, per minute (the Δ/MIN column).
    pub fn change_per_minute(&self, key: &SeriesKey, now_ms: i64) -> Option<i64> {
        change_per_minute(&self.points_between(key, now_ms - DELTA_SPAN_MS, now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{GIB, MIB, T0_MS, gpu, host, obs};

    fn device_key() -> SeriesKey {
        SeriesKey::Device(gpu(0, 1, 0, &[]).info.uuid.clone())
    }

    fn observed(charts: &mut Charts, t_s: i64, used: u64, contiguous: bool) {
        let o = obs(t_s, vec![gpu(0, 140 * GIB, used, &[(7, used)])], vec![]);
        charts.update(ChartsEvent::Observed {
            obs: &o,
            contiguous,
        });
    }

    #[test]
    fn zoom_steps_stop_at_either_end() {
        let mut charts = Charts::default();
        assert_eq!(charts.zoom, Zoom::FiveMinutes);
        charts.update(ChartsEvent::ZoomIn);
        charts.update(ChartsEvent::ZoomIn);
        assert_eq!(charts.zoom, Zoom::Minute);
        for _ in 0..10 {
            charts.update(ChartsEvent::ZoomOut);
        }
        assert_eq!(charts.zoom, Zoom::Day);
    }

    #[test]
    fn the_window_follows_the_zoom() {
        let mut charts = Charts::default();
        observed(&mut charts, 0, GIB, true);
        observed(&mut charts, 120, GIB, true);
        let now = T0_MS + 120_000;
        assert_eq!(charts.points(&device_key(), now).len(), 2);
        charts.update(ChartsEvent::ZoomIn);
        assert_eq!(
            charts.points(&device_key(), now).len(),
            1,
            "1m: 2 min is out"
        );
    }

    #[test]
    fn a_jump_starts_the_series_afresh_and_a_step_goes_on() {
        let mut charts = Charts::default();
        observed(&mut charts, 0, GIB, true);
        observed(&mut charts, 10, GIB, true);
        let now = T0_MS + 10_000;
        assert_eq!(charts.points(&device_key(), now).len(), 2);
        observed(&mut charts, 20, GIB, false);
        assert_eq!(charts.points(&device_key(), T0_MS + 20_000).len(), 1);
    }

    #[test]
    fn change_per_minute_looks_back_one_minute() {
        let mut charts = Charts::default();
        for t in 0..=6 {
            observed(
                &mut charts,
                t * 10,
                GIB + u64::try_from(t).unwrap() * 10 * MIB,
                true,
            );
        }
        let key = SeriesKey::Process {
            uuid: gpu(0, 1, 0, &[]).info.uuid.clone(),
            pid: 7,
        };
        assert_eq!(
            charts.change_per_minute(&key, T0_MS + 60_000),
            Some(i64::try_from(60 * MIB).unwrap())
        );
    }

    #[test]
    fn loaded_history_comes_before_the_own_samples_and_only_for_the_same_process() {
        let mut charts = Charts::default();
        let o = obs(
            600,
            vec![gpu(0, 140 * GIB, GIB, &[(101, GIB)])],
            vec![host(101, 1, "alice", "python train.py")],
        );
        charts.update(ChartsEvent::Observed {
            obs: &o,
            contiguous: true,
        });
        let key = SeriesKey::Process {
            uuid: gpu(0, 1, 0, &[]).info.uuid.clone(),
            pid: 101,
        };
        let mut chunk = HistoryChunk::default();
        chunk.series.insert(
            key.clone(),
            vec![Point {
                t_ms: T0_MS + 500_000,
                bytes: 7,
            }],
        );
        chunk.starts = o.starts();
        charts.update(ChartsEvent::Loaded(chunk.clone()));
        let now = T0_MS + 600_000;
        let bytes: Vec<u64> = charts.points(&key, now).iter().map(|p| p.bytes).collect();
        assert_eq!(bytes, [7, GIB]);
        // Loaded for an earlier process under the same PID: not joined.
        chunk.starts.insert(101, 1);
        charts.update(ChartsEvent::Loaded(chunk));
        assert_eq!(charts.points(&key, now).len(), 1);
    }
}
