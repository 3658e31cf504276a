//! Best available and nearby seats: blocks of side-by-side free seats, scored by where they are.
//!
//! A block is `n` seats of one row with consecutive numbers (a seat not on sale breaks a row). Its score puts
//! the venue's first-listed section first, then the first row of a section, then the block nearest the row's
//! centre:
//!
//! `score = -(1,000,000 × section rank + 1,000 × row rank + |(first + last) - (row's lowest + highest number)|)`
//!
//! Ranks count from 0 in the catalogue's order (sections as the venue lists them, rows by label), and the last
//! term is twice the distance, in seats, from the block's centre to the row's. The best block scores 0; a higher
//! score is better. (A venue keeps this exact while its sections have under 1,000 rows and its rows under 500
//! seats.) Nearby seats are measured on the map instead: the distance between the centres (mean x, y) of two
//! blocks.

use super::{Catalogue, SeatId, SeatInfo};

/// What a fan asks for.
#[derive(Debug, Clone, Default)]
pub struct Want {
    pub quantity: usize,
    pub ticket_type_id: Option<i64>,
    pub section: Option<String>,
    /// Accessible seats only.
    pub accessible: bool,
}

/// Some free seats, and how good they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub seats: Vec<SeatId>,
    /// The score of a side-by-side block; for seats in several pieces, the lowest of the pieces'.
    pub score: i64,
    /// Whether the seats are one side-by-side block.
    pub together: bool,
}

/// What is left for a request that found no block: seats that fit it, and the longest run of them side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub available: usize,
    pub largest_block: usize,
}

/// A run of consecutive catalogue positions whose seats sit side by side in one row, and where its row is.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: usize,
    len: usize,
    section_rank: i64,
    row_rank: i64,
    /// The row's lowest plus highest seat number: twice its centre.
    row_span: i64,
}

/// Runs of seats that are free and fit `fits`, in map order. `free[i]` is the catalogue's i-th seat.
fn runs(cat: &Catalogue, free: &[bool], fits: impl Fn(&SeatInfo) -> bool) -> Vec<Run> {
    let seats = cat.seats();
    let mut out = Vec::new();
    let (mut section_rank, mut row_rank) = (-1i64, 0i64);
    let mut row_start = 0;
    while row_start < seats.len() {
        let first = &seats[row_start];
        let row_end = row_start
            + seats[row_start..].iter().take_while(|s| s.section == first.section && s.row == first.row).count();
        if row_start == 0 || seats[row_start - 1].section != first.section {
            section_rank += 1;
            row_rank = 0;
        } else {
            row_rank += 1;
        }
        let row = &seats[row_start..row_end];
        let low = row.iter().map(|s| s.number).min().unwrap_or(0);
        let high = row.iter().map(|s| s.number).max().unwrap_or(0);
        let row_span = i64::from(low) + i64::from(high);
        let mut i = row_start;
        while i < row_end {
            if !(free.get(i).copied().unwrap_or(false) && fits(&seats[i])) {
                i += 1;
                continue;
            }
            let start = i;
            i += 1;
            while i < row_end
                && free.get(i).copied().unwrap_or(false)
                && fits(&seats[i])
                && seats[i].number == seats[i - 1].number + 1
            {
                i += 1;
            }
            out.push(Run { start, len: i - start, section_rank, row_rank, row_span });
        }
        row_start = row_end;
    }
    out
}

fn score(run: &Run, cat: &Catalogue, start: usize, n: usize) -> i64 {
    let seats = cat.seats();
    let ends = i64::from(seats[start].number) + i64::from(seats[start + n - 1].number);
    -(1_000_000 * run.section_rank + 1_000 * run.row_rank + (ends - run.row_span).abs())
}

/// Every block of `n` side-by-side seats within the runs: (score, catalogue position of its first seat).
fn windows(runs: &[Run], cat: &Catalogue, n: usize) -> Vec<(i64, usize)> {
    let mut out = Vec::new();
    for run in runs.iter().filter(|r| r.len >= n && n > 0) {
        for start in run.start..=run.start + run.len - n {
            out.push((score(run, cat, start, n), start));
        }
    }
    out
}

fn block(cat: &Catalogue, start: usize, n: usize, score: i64) -> Block {
    Block { seats: cat.seats()[start..start + n].iter().map(|s| s.id).collect(), score, together: true }
}

fn fits(want: &Want) -> impl Fn(&SeatInfo) -> bool + '_ {
    move |s: &SeatInfo| {
        want.ticket_type_id.is_none_or(|t| s.ticket_type_id == t)
            && want.section.as_deref().is_none_or(|name| s.section == name)
            && (!want.accessible || s.accessible)
    }
}

/// The best `limit` blocks of `want.quantity` side-by-side free seats, best first (ties: map order). They may
/// overlap: each is a candidate in case a better one went meanwhile.
pub fn best_blocks(cat: &Catalogue, free: &[bool], want: &Want, limit: usize) -> Vec<Block> {
    let n = want.quantity;
    let mut all = windows(&runs(cat, free, fits(want)), cat, n);
    let by_score = |a: &(i64, usize), b: &(i64, usize)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if all.len() > limit && limit > 0 {
        all.select_nth_unstable_by(limit - 1, by_score);
        all.truncate(limit);
    }
    all.sort_unstable_by(by_score);
    all.into_iter().take(limit).map(|(score, start)| block(cat, start, n, score)).collect()
}

/// `want.quantity` free seats in the fewest side-by-side pieces: the longest piece that still fits first (the
/// best of that length), then again for what is still missing. `None` if fewer seats fit the request.
pub fn best_split(cat: &Catalogue, free: &[bool], want: &Want) -> Option<Block> {
    let mut free = free.to_vec();
    let mut missing = want.quantity;
    let (mut seats, mut lowest, mut pieces) = (Vec::with_capacity(missing), 0i64, 0);
    while missing > 0 {
        let runs = runs(cat, &free, fits(want));
        let longest = runs.iter().map(|r| r.len).max()?;
        let n = longest.min(missing);
        let (score, start) = windows(&runs, cat, n).into_iter().max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))?;
        for (i, seat) in cat.seats()[start..start + n].iter().enumerate() {
            free[start + i] = false;
            seats.push(seat.id);
        }
        lowest = if pieces == 0 { score } else { lowest.min(score) };
        pieces += 1;
        missing -= n;
    }
    Some(Block { seats, score: lowest, together: pieces == 1 })
}

/// The blocks as one list of seats, each once, and where each block starts in it: side-by-side blocks share
/// their seats (in map order); a block in pieces gets seats of its own at the end.
pub fn pack(cat: &Catalogue, blocks: &[Block]) -> (Vec<SeatId>, Vec<usize>) {
    let at = |s: &SeatId| cat.position(*s).unwrap_or(usize::MAX);
    let mut seats: Vec<SeatId> = blocks.iter().filter(|b| b.together).flat_map(|b| b.seats.iter().copied()).collect();
    seats.sort_unstable_by_key(at);
    seats.dedup();
    let shared = seats.len();
    let starts = blocks
        .iter()
        .map(|b| match b.seats.first() {
            Some(first) if b.together => seats[..shared].partition_point(|s| at(s) < at(first)),
            _ => {
                seats.extend_from_slice(&b.seats);
                seats.len() - b.seats.len()
            }
        })
        .collect();
    (seats, starts)
}

/// What is left that fits the request.
pub fn left(cat: &Catalogue, free: &[bool], want: &Want) -> Left {
    let runs = runs(cat, free, fits(want));
    Left { available: runs.iter().map(|r| r.len).sum(), largest_block: runs.iter().map(|r| r.len).max().unwrap_or(0) }
}

/// The centre of some seats on the map (mean x, y); `None` if none is in the catalogue.
fn centre(cat: &Catalogue, seats: &[SeatId]) -> Option<(f64, f64)> {
    let placed: Vec<&SeatInfo> = seats.iter().filter_map(|&s| cat.seat(s)).collect();
    if placed.is_empty() {
        return None;
    }
    let n = placed.len() as f64;
    Some((
        placed.iter().map(|s| f64::from(s.x)).sum::<f64>() / n,
        placed.iter().map(|s| f64::from(s.y)).sum::<f64>() / n,
    ))
}

/// Blocks of `n` side-by-side free seats nearest to `around` on the map, nearest first, at most `limit`; the
/// score field is unused (0). Blocks may overlap.
pub fn nearest_blocks(cat: &Catalogue, free: &[bool], around: &[SeatId], n: usize, limit: usize) -> Vec<Block> {
    let Some((cx, cy)) = centre(cat, around) else {
        return Vec::new();
    };
    let seats = cat.seats();
    let mut all: Vec<(f64, usize)> = windows(&runs(cat, free, |_| true), cat, n)
        .into_iter()
        .map(|(_, start)| {
            let block = &seats[start..start + n];
            let x = block.iter().map(|s| f64::from(s.x)).sum::<f64>() / n as f64;
            let y = block.iter().map(|s| f64::from(s.y)).sum::<f64>() / n as f64;
            ((x - cx).hypot(y - cy), start)
        })
        .collect();
    all.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    all.into_iter().take(limit).map(|(_, start)| block(cat, start, n, 0)).collect()
}

/// The distance between the centres of two sets of seats on the map.
pub fn distance(cat: &Catalogue, a: &[SeatId], b: &[SeatId]) -> Option<f64> {
    let ((ax, ay), (bx, by)) = (centre(cat, a)?, centre(cat, b)?);
    Some((ax - bx).hypot(ay - by))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventId, EventInfo};

    /// Two sections ("A" then "B"), two rows each, seats 1..=6 a row; seat 4 of section A's row 1 is not on sale.
    fn venue() -> Catalogue {
        let mut seats = Vec::new();
        let mut id = 0;
        for (si, section) in ["A", "B"].iter().enumerate() {
            for (ri, row) in ["1", "2"].iter().enumerate() {
                for number in 1..=6 {
                    id += 1;
                    if *section == "A" && *row == "1" && number == 4 {
                        continue;
                    }
                    seats.push(SeatInfo {
                        id: SeatId(id),
                        label: format!("{section} {row} {number}"),
                        section: (*section).into(),
                        row: (*row).into(),
                        number,
                        x: si as i32 * 10 + number,
                        y: ri as i32,
                        accessible: number == 6,
                        ticket_type_id: if *section == "A" { 1 } else { 2 },
                        price_cents: 100,
                    });
                }
            }
        }
        let event = EventInfo {
            id: EventId(1),
            name: "e".into(),
            venue: "v".into(),
            starts_at: String::new(),
            currency: "EUR".into(),
        };
        Catalogue::new(event, Vec::new(), seats, 1)
    }

    fn ids(block: &Block) -> Vec<i64> {
        block.seats.iter().map(|s| s.0).collect()
    }

    #[test]
    fn the_best_block_is_in_the_first_section_and_row_nearest_the_centre() {
        let cat = venue();
        let free = vec![true; cat.seats().len()];
        let want = Want { quantity: 2, ..Want::default() };
        let blocks = best_blocks(&cat, &free, &want, 100);
        // Row A1 has 1-3 and 5-6 (4 is not on sale): its centre is 3.5, so 2-3 and 5-6 are 1.5 and 2 seats off.
        assert_eq!(ids(&blocks[0]), vec![2, 3]);
        assert_eq!(blocks[0].score, -2, "|(2 + 3) - (1 + 6)|");
        assert_eq!(ids(&blocks[1]), vec![1, 2]);
        assert!(blocks.windows(2).all(|w| w[0].score >= w[1].score));
        // No block spans the seat that is not on sale.
        assert!(blocks.iter().all(|b| ids(b) != vec![3, 5]));
        // Every block of section A comes before section B's.
        let first_b = blocks.iter().position(|b| b.seats[0].0 > 12).expect("section B");
        assert!(blocks[first_b..].iter().all(|b| b.seats[0].0 > 12));
    }

    #[test]
    fn filters_keep_to_the_section_ticket_type_and_accessible_seats() {
        let cat = venue();
        let free = vec![true; cat.seats().len()];
        let b = best_blocks(&cat, &free, &Want { quantity: 1, section: Some("B".into()), ..Want::default() }, 1);
        assert!(b[0].seats[0].0 > 12);
        let t = best_blocks(&cat, &free, &Want { quantity: 3, ticket_type_id: Some(2), ..Want::default() }, 50);
        assert!(t.iter().all(|b| b.seats.iter().all(|s| cat.seat(*s).expect("seat").ticket_type_id == 2)));
        let a = best_blocks(&cat, &free, &Want { quantity: 1, accessible: true, ..Want::default() }, 50);
        assert_eq!(a.len(), 4, "seat 6 of every row");
        assert!(best_blocks(&cat, &free, &Want { quantity: 2, accessible: true, ..Want::default() }, 50).is_empty());
    }

    #[test]
    fn taken_seats_break_blocks_and_a_split_fills_from_the_longest_piece() {
        let cat = venue();
        // Only A1's 1-3 and 5 are free, and B2's 1.
        let free: Vec<bool> = cat.seats().iter().map(|s| [1, 2, 3, 5, 19].contains(&s.id.0)).collect();
        let want = Want { quantity: 4, ..Want::default() };
        assert!(best_blocks(&cat, &free, &want, 10).is_empty());
        assert_eq!(left(&cat, &free, &want), Left { available: 5, largest_block: 3 });
        let split = best_split(&cat, &free, &want).expect("5 seats are free");
        assert_eq!(ids(&split), vec![1, 2, 3, 5]);
        assert!(!split.together);
        assert!(best_split(&cat, &free, &Want { quantity: 6, ..Want::default() }).is_none());
    }

    #[test]
    fn packed_blocks_share_their_seats() {
        let cat = venue();
        let free = vec![true; cat.seats().len()];
        let blocks = best_blocks(&cat, &free, &Want { quantity: 3, ..Want::default() }, 10);
        let (seats, starts) = pack(&cat, &blocks);
        assert!(seats.len() < blocks.len() * 3, "overlapping blocks share seats");
        for (block, start) in blocks.iter().zip(&starts) {
            assert_eq!(&seats[*start..*start + 3], block.seats.as_slice());
        }
        let split = Block { seats: vec![SeatId(1), SeatId(5)], score: 0, together: false };
        let (seats, starts) = pack(&cat, &[blocks[0].clone(), split]);
        assert_eq!(&seats[starts[1]..], &[SeatId(1), SeatId(5)]);
    }

    #[test]
    fn nearby_blocks_come_nearest_first() {
        let cat = venue();
        let free: Vec<bool> = cat.seats().iter().map(|s| s.id.0 != 2).collect();
        let near = nearest_blocks(&cat, &free, &[SeatId(2), SeatId(3)], 2, 3);
        assert_eq!(near.len(), 3);
        let d: Vec<f64> =
            near.iter().map(|b| distance(&cat, &b.seats, &[SeatId(2), SeatId(3)]).expect("placed")).collect();
        assert!(d.windows(2).all(|w| w[0] <= w[1]), "{d:?}");
        assert!(near.iter().all(|b| !b.seats.contains(&SeatId(2))), "taken seats are never offered");
    }
}
