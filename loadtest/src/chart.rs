//! The run drawn over time, as one self-contained HTML page of SVG charts (`charts.html`): nothing is fetched,
//! so it reads the same offline.

use plotters::prelude::*;

use crate::crowd::CrowdFigures;
use crate::run::{Percentiles, Sample};

/// One line of a chart: its name, colour and points (seconds into the run, value).
struct Line {
    name: &'static str,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

/// A line chart as SVG text; an empty string when there is nothing to draw.
fn chart(title: &str, y_label: &str, lines: &[Line]) -> String {
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
    let x_max = xs.fold(0.0f64, f64::max).max(1.0);
    let y_max = ys.fold(0.0f64, f64::max).max(1.0) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 320)).into_drawing_area();
        let drawn = (|| -> Result<(), Box<dyn std::error::Error>> {
            root.fill(&WHITE)?;
            let mut c = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
            c.configure_mesh().x_desc("seconds into the run").y_desc(y_label).draw()?;
            for line in lines {
                let colour = line.colour;
                c.draw_series(LineSeries::new(line.points.iter().copied(), colour.stroke_width(2)))?
                    .label(line.name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
            }
            c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
            root.present()?;
            Ok(())
        })();
        if drawn.is_err() {
            return String::new();
        }
    }
    svg
}

/// A latency percentile over time. A window without a sample has no latency, not a zero one: it is left out.
fn latency_points(
    series: &[Sample],
    which: fn(&Sample) -> &Percentiles,
    q: fn(&Percentiles) -> f64,
) -> Vec<(f64, f64)> {
    series.iter().filter(|s| which(s).count > 0).map(|s| (s.at_seconds, q(which(s)))).collect()
}

fn p50(p: &Percentiles) -> f64 {
    p.p50
}

fn p99(p: &Percentiles) -> f64 {
    p.p99
}

/// The page: fans waiting and admitted, admissions a minute against the rate setting, seats sold, hold and
/// checkout latency, and the seat map's delta latency, each over time.
pub fn page(title: &str, series: &[Sample], rate_setting: Option<u32>, crowd: Option<&CrowdFigures>) -> String {
    let points = |f: &dyn Fn(&Sample) -> f64| series.iter().map(|s| (s.at_seconds, f(s))).collect::<Vec<_>>();
    let latency = |which: fn(&Sample) -> &Percentiles, q: fn(&Percentiles) -> f64| latency_points(series, which, q);
    let mut admissions = Vec::new();
    for pair in series.windows(2) {
        let minutes = (pair[1].at_seconds - pair[0].at_seconds) / 60.0;
        if minutes > 0.0 {
            admissions.push((pair[1].at_seconds, pair[1].admitted.saturating_sub(pair[0].admitted) as f64 / minutes));
        }
    }
    let mut rate = vec![Line { name: "admitted a minute", colour: BLUE, points: admissions }];
    if let Some(setting) = rate_setting {
        let end = series.last().map_or(1.0, |s| s.at_seconds);
        rate.push(Line {
            name: "rate setting",
            colour: RED,
            points: vec![(0.0, f64::from(setting)), (end, f64::from(setting))],
        });
    }
    let mut crowd_lines = vec![
        Line { name: "waiting", colour: RED, points: points(&|s| s.waiting as f64) },
        Line { name: "admitted (total)", colour: BLUE, points: points(&|s| s.admitted as f64) },
    ];
    let mut seat_lines = vec![Line { name: "seats sold", colour: GREEN, points: points(&|s| s.seats_sold as f64) }];
    if crowd.is_some_and(|c| c.bots.accounts > 0) {
        crowd_lines.push(Line { name: "bots admitted", colour: MAGENTA, points: points(&|s| s.bots_admitted as f64) });
        seat_lines.push(Line { name: "seats bots bought", colour: MAGENTA, points: points(&|s| s.bots_seats as f64) });
    }
    let charts = [
        chart("Fans waiting and admitted", "fans", &crowd_lines),
        chart("Admissions a minute", "fans a minute", &rate),
        chart("Seats sold", "seats", &seat_lines),
        chart(
            "Hold and checkout latency",
            "ms",
            &[
                Line { name: "hold p50", colour: BLUE, points: latency(|s| &s.hold_ms, p50) },
                Line { name: "hold p99", colour: CYAN, points: latency(|s| &s.hold_ms, p99) },
                Line { name: "checkout p50", colour: RED, points: latency(|s| &s.checkout_ms, p50) },
                Line { name: "checkout p99", colour: MAGENTA, points: latency(|s| &s.checkout_ms, p99) },
            ],
        ),
        chart(
            "Seat map delta latency (commit to receipt)",
            "ms",
            &[
                Line { name: "p50", colour: BLUE, points: latency(|s| &s.delta_ms, p50) },
                Line { name: "p99", colour: RED, points: latency(|s| &s.delta_ms, p99) },
            ],
        ),
    ];
    let mut html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;margin:2em;color:#222}}figure{{margin:0 0 1.5em}}</style></head><body>\
         <h1>{title}</h1><p>Every point covers the seconds since the one before it (latencies are that window's \
         percentiles; counts are totals so far).</p>\n"
    );
    if let Some(c) = crowd {
        html.push_str(&crowd_table(c));
    }
    for svg in charts.iter().filter(|svg| !svg.is_empty()) {
        html.push_str("<figure>");
        html.push_str(svg);
        html.push_str("</figure>\n");
    }
    html.push_str("</body></html>\n");
    html
}

/// Fans against bots, as a table.
fn crowd_table(c: &CrowdFigures) -> String {
    let share = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0));
    let rows: [(&str, u64, u64); 6] = [
        ("places", c.fans.places, c.bots.places),
        ("held in the endless queue", c.fans.held_in_the_endless_queue, c.bots.held_in_the_endless_queue),
        ("admitted", c.fans.admitted, c.bots.admitted),
        ("orders", c.fans.orders, c.bots.orders),
        ("seats", c.fans.seats, c.bots.seats),
        ("refused at the gate", c.fans.refused_by_the_gate, c.bots.refused_by_the_gate),
    ];
    let mut html = String::from("<table><tr><th></th><th>fans</th><th>bots</th></tr>");
    for (what, fans, bots) in rows {
        html.push_str(&format!("<tr><td>{what}</td><td>{fans}</td><td>{bots}</td></tr>"));
    }
    html.push_str(&format!(
        "<tr><td>solving CPU</td><td>{:.1} s</td><td>{:.1} s</td></tr></table>\n<p>Bots' share: {} of places, {} \
         of seats, {} of the solving CPU.</p>\n",
        c.fans.solving_cpu_seconds,
        c.bots.solving_cpu_seconds,
        share(c.bots_share_of_places),
        share(c.bots_share_of_seats),
        share(c.bots_share_of_solving)
    ));
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_draws_every_chart_and_fetches_nothing() {
        let sample = |at: f64, admitted: u64| Sample {
            at_seconds: at,
            joined: 100,
            admitted,
            waiting: 100 - admitted,
            seats_sold: admitted * 2,
            bots_admitted: 0,
            bots_seats: 0,
            hold_ms: Percentiles { count: 3, p50: 2.0, p95: 5.0, p99: 9.0, max: 9.0 },
            checkout_ms: Percentiles::default(),
            delta_ms: Percentiles { count: 3, p50: 1.0, p95: 3.0, p99: 4.0, max: 4.0 },
        };
        let html = page("Run", &[sample(0.0, 0), sample(5.0, 40), sample(10.0, 90)], Some(600), None);
        assert_eq!(html.matches("<svg").count(), 5, "five charts");
        // The checkout latency has no sample at all: its line is empty, not drawn at zero.
        let series = [sample(0.0, 0), sample(5.0, 40)];
        assert!(latency_points(&series, |s| &s.checkout_ms, |p| p.p99).is_empty());
        assert_eq!(latency_points(&series, |s| &s.hold_ms, |p| p.p99), vec![(0.0, 9.0), (5.0, 9.0)]);
        for name in ["waiting", "rate setting", "seats sold", "checkout p99", "Seat map delta latency"] {
            assert!(html.contains(name), "{name}");
        }
        for fetch in ["src=", "href=", "<script", "@import", "url("] {
            assert!(!html.contains(fetch), "self-contained: {fetch}");
        }
    }

    #[test]
    fn a_run_with_bots_draws_them_apart_and_tabulates_both_kinds() {
        let kind = |accounts, seats| crate::crowd::KindFigures {
            accounts,
            places: accounts,
            held_in_the_endless_queue: 0,
            admitted: accounts,
            orders: seats / 2,
            seats,
            solves: accounts,
            hashes: accounts * 10,
            solving_cpu_seconds: 1.0,
            refused_by_the_gate: 0,
            out_of_budget: 0,
        };
        let crowd = CrowdFigures {
            ns_per_hash: 300.0,
            fans: kind(10, 20),
            bots: kind(5, 6),
            bots_share_of_places: Some(1.0 / 3.0),
            bots_share_of_seats: Some(6.0 / 26.0),
            bots_share_of_solving: Some(1.0 / 3.0),
            fan_cpu_ms_per_place: Some(100.0),
            bot_cpu_ms_per_place: Some(200.0),
        };
        let sample = Sample {
            at_seconds: 1.0,
            joined: 15,
            admitted: 15,
            waiting: 0,
            seats_sold: 26,
            bots_admitted: 5,
            bots_seats: 6,
            hold_ms: Percentiles::default(),
            checkout_ms: Percentiles::default(),
            delta_ms: Percentiles::default(),
        };
        let html = page("Run", &[sample.clone(), Sample { at_seconds: 2.0, ..sample }], None, Some(&crowd));
        for text in ["bots admitted", "seats bots bought", "<td>seats</td><td>20</td><td>6</td>", "23.1% of seats"] {
            assert!(html.contains(text), "{text}");
        }
    }
}
