//! Where each part of the screen goes: pure geometry from the terminal size, the number of
//! device lines and whether the detail pane is open.
//!
//! The state needs it as much as the drawing does (how many rows a page is, which row a
//! click hit, where the dialog's buttons are), so it lives below both: the state (`app`)
//! and the drawing (`view`) depend on this module, it on neither.

use std::collections::BTreeSet;

use ratatui::layout::Rect;
use vramctl_core::types::{DeviceSnapshot, MigInstanceInfo, UnopenedDevice};

use vramctl_observe::observation::Observation;
use vramctl_observe::pid_view::OtherHolders;

/// The smallest terminal the screen is laid out for.
pub const MIN_WIDTH: u16 = 80;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u16 = 24;

/// Where each part of the screen goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    /// The whole screen.
    pub screen: Rect,
    /// Below the minimum size: nothing but a message.
    pub too_small: bool,
    /// The header line.
    pub header: Rect,
    /// One line per GPU / MIG instance.
    pub devices: Rect,
    /// The focused GPU's memory chart.
    pub chart: Option<Rect>,
    /// The process table, header line included.
    pub table: Option<Rect>,
    /// The selected process's pane.
    pub detail: Option<Rect>,
    /// The footer line.
    pub footer: Rect,
}

impl Areas {
    /// How many table rows fit below the table's header.
    pub fn table_body_rows(&self) -> usize {
        self.table
            .map_or(0, |t| usize::from(t.height.saturating_sub(1)))
    }
}

/// The layout inside `screen` for `device_lines` lines of devices; `detail`: the detail
/// pane of a selected process is open (it takes the chart's place).
pub fn areas(screen: Rect, device_lines: usize, detail: bool) -> Areas {
    let line = |y: u16, height: u16| Rect::new(screen.x, y, screen.width, height);
    if screen.width < MIN_WIDTH || screen.height < MIN_HEIGHT {
        return Areas {
            screen,
            too_small: true,
            header: line(screen.y, 0),
            devices: line(screen.y, 0),
            chart: None,
            table: None,
            detail: None,
            footer: line(screen.y, 0),
        };
    }
    let header = line(screen.y, 1);
    let footer = line(screen.bottom() - 1, 1);
    let body = screen.height - 2;
    let wanted = u16::try_from(device_lines).unwrap_or(u16::MAX).max(1);
    let device_rows = wanted.min(body / 2);
    let devices = line(screen.y + 1, device_rows);
    let mut rest = body - device_rows;
    let mut y = devices.bottom();

    let mut chart = None;
    let mut detail_area = None;
    if detail {
        let h = (rest / 2).clamp(7, 14);
        detail_area = Some(line(y + rest - h, h));
        rest -= h;
    } else if rest >= 19 {
        let h = (rest / 3).clamp(7, 12);
        chart = Some(line(y, h));
        y += h;
        rest -= h;
    }
    let table = Some(line(y, rest));
    Areas {
        screen,
        too_small: false,
        header,
        devices,
        chart,
        table,
        detail: detail_area,
        footer,
    }
}

/// What one device line shows.
#[derive(Debug, Clone, Copy)]
pub enum DeviceLine<'a> {
    /// Nothing to show yet (or no GPU passes `--gpu`).
    Waiting,
    /// A GPU.
    Gpu(&'a DeviceSnapshot),
    /// A MIG instance of that GPU.
    Mig(&'a DeviceSnapshot, &'a MigInstanceInfo),
    /// A GPU the driver lists but that could not be opened.
    Unopened(&'a UnopenedDevice),
    /// The memory processes outside this PID namespace hold on the GPU above, as a host
    /// daemon answered for the namespace (`vramctl_observe::pid_view`): one figure, no
    /// process, so nothing to select, kill or reclaim.
    Others(&'a OtherHolders),
}

/// The device lines of `obs`: each GPU `devices` selects (all when `None`) with its MIG
/// instances, then, when no GPU was chosen, those that could not be opened.
pub fn device_lines<'a>(
    obs: Option<&'a Observation>,
    devices: Option<&BTreeSet<String>>,
) -> Vec<DeviceLine<'a>> {
    let Some(obs) = obs else {
        return vec![DeviceLine::Waiting];
    };
    let mut out = Vec::new();
    for device in &obs.snapshot.devices {
        if !devices.is_none_or(|d| d.contains(&device.info.uuid)) {
            continue;
        }
        out.push(DeviceLine::Gpu(device));
        if device.reading().is_some() {
            for mig in &device.info.mig_instances {
                out.push(DeviceLine::Mig(device, mig));
            }
        }
        if let Some(others) = obs.pid_view.others_on(device.info.index) {
            out.push(DeviceLine::Others(others));
        }
    }
    if devices.is_none() {
        out.extend(obs.snapshot.unopened.iter().map(DeviceLine::Unopened));
    }
    if out.is_empty() {
        out.push(DeviceLine::Waiting);
    }
    out
}

/// A box `width` × `height` in the middle of `screen` (cut to it).
pub fn centered(screen: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(screen.width);
    let h = height.min(screen.height);
    Rect::new(
        screen.x + (screen.width - w) / 2,
        screen.y + (screen.height - h) / 2,
        w,
        h,
    )
}

/// The kill dialog's box on `screen`.
pub fn dialog_area(screen: Rect) -> Rect {
    centered(screen, 72, 14)
}

/// The kill and cancel buttons of the kill confirmation on `screen`; `None` when the
/// screen is too low to hold them.
pub fn dialog_buttons(screen: Rect) -> Option<(Rect, Rect)> {
    let area = dialog_area(screen);
    let y = area.bottom().checked_sub(2)?;
    let mid = area.x + area.width / 2;
    Some((
        Rect::new(mid.saturating_sub(16), y, 12, 1),
        Rect::new(mid + 4, y, 12, 1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{GIB, gpu, obs};

    #[test]
    fn below_the_minimum_only_a_message_fits() {
        for (w, h) in [(79, 40), (120, 23), (0, 0)] {
            let a = areas(Rect::new(0, 0, w, h), 1, false);
            assert!(a.too_small, "{w}×{h}");
            assert_eq!(a.table_body_rows(), 0);
        }
        assert!(!areas(Rect::new(0, 0, 80, 24), 1, false).too_small);
    }

    #[test]
    fn the_chart_needs_room_and_gives_way_to_the_detail_pane() {
        // 120×40 with one GPU: header, 1 device line, a chart, the table, the footer.
        let a = areas(Rect::new(0, 0, 120, 40), 1, false);
        let chart = a.chart.expect("room for the chart");
        let table = a.table.unwrap();
        assert_eq!((a.devices.height, chart.y, chart.height), (1, 2, 12));
        assert_eq!((table.y, table.height), (14, 25));
        assert_eq!(a.table_body_rows(), 24);
        assert_eq!(a.footer.y, 39);
        // The detail pane replaces the chart, at the bottom.
        let d = areas(Rect::new(0, 0, 120, 40), 1, true);
        assert_eq!(d.chart, None);
        let detail = d.detail.unwrap();
        assert_eq!(detail.bottom(), d.footer.y);
        assert_eq!(d.table.unwrap().bottom(), detail.y);
        // 80×24: room for a chart below one GPU, not below eight.
        assert_eq!(
            areas(Rect::new(0, 0, 80, 24), 1, false)
                .chart
                .map(|c| c.height),
            Some(7)
        );
        assert_eq!(areas(Rect::new(0, 0, 80, 24), 8, false).chart, None);
        // Devices take at most half the body.
        assert_eq!(
            areas(Rect::new(0, 0, 80, 24), 100, false).devices.height,
            11
        );
    }

    #[test]
    fn device_lines_follow_the_gpu_selection() {
        assert!(matches!(
            device_lines(None, None).as_slice(),
            [DeviceLine::Waiting]
        ));
        let o = obs(0, vec![gpu(0, GIB, 0, &[]), gpu(1, GIB, 0, &[])], vec![]);
        assert_eq!(device_lines(Some(&o), None).len(), 2);
        let second: BTreeSet<String> = [o.snapshot.devices[1].info.uuid.clone()].into();
        let lines = device_lines(Some(&o), Some(&second));
        assert!(matches!(lines.as_slice(), [DeviceLine::Gpu(d)] if d.info.index == 1));
        let none: BTreeSet<String> = ["GPU-other".to_owned()].into();
        assert!(matches!(
            device_lines(Some(&o), Some(&none)).as_slice(),
            [DeviceLine::Waiting]
        ));
    }

    #[test]
    fn dialog_buttons_sit_on_the_dialogs_last_inner_line() {
        let screen = Rect::new(0, 0, 120, 40);
        let (kill, cancel) = dialog_buttons(screen).unwrap();
        let dialog = dialog_area(screen);
        assert_eq!(kill.y, dialog.bottom() - 2);
        assert!(dialog.contains(kill.as_position()) && dialog.contains(cancel.as_position()));
        assert!(kill.right() < cancel.x);
        assert_eq!(dialog_buttons(Rect::new(0, 0, 120, 1)), None);
    }
}
