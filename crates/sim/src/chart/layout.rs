//! Where a chart's final values go: beside each line's end, nudged apart
//! where two would overlap. Pure functions of pixel positions, so the
//! layout is tested without drawing.

/// The final values of a chart's lines as labels, all with the same
/// number of decimals: none if every value is whole, else as many as
/// three significant digits of the largest need (at most two), so that
/// 3.63 and 0.60 line up.
pub fn value_labels(values: &[f64]) -> Vec<String> {
    let largest = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let decimals = if values.iter().all(|v| v.fract() == 0.0) || largest >= 100.0 {
        0
    } else if largest >= 10.0 {
        1
    } else {
        2
    };
    values.iter().map(|v| format!("{v:.decimals$}")).collect()
}

/// Vertical centres for labels that want to sit at `wanted`, at least
/// `gap` apart and within `[lo, hi]`, keeping their order. Labels that
/// would overlap are moved as a group, centred on where its members want
/// to be (the least total squared displacement), rather than all pushed
/// one way; where they do not all fit, the gap shrinks so they do.
pub fn spread(wanted: &[f64], gap: f64, lo: f64, hi: f64) -> Vec<f64> {
    let n = wanted.len();
    if n == 0 {
        return Vec::new();
    }
    let gap = if n > 1 {
        gap.min((hi - lo) / (n - 1) as f64).max(0.0)
    } else {
        gap
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| wanted[a].total_cmp(&wanted[b]).then(a.cmp(&b)));
    // Runs of consecutive labels stacked `gap` apart: `sum` is the sum of
    // each member's wish less its offset in the stack, so `sum / len` is
    // the stack's best top.
    struct Stack {
        first: usize,
        len: usize,
        sum: f64,
    }
    let top = |s: &Stack| s.sum / s.len as f64;
    let mut stacks: Vec<Stack> = Vec::new();
    for (at, &i) in order.iter().enumerate() {
        stacks.push(Stack {
            first: at,
            len: 1,
            sum: wanted[i],
        });
        while let [.., a, b] = stacks.as_slice() {
            if top(b) >= top(a) + a.len as f64 * gap {
                break;
            }
            let merged = Stack {
                first: a.first,
                len: a.len + b.len,
                sum: a.sum + b.sum - (a.len * b.len) as f64 * gap,
            };
            stacks.truncate(stacks.len() - 2);
            stacks.push(merged);
        }
    }
    let mut placed = vec![0.0; n];
    for s in &stacks {
        for k in 0..s.len {
            placed[order[s.first + k]] = top(s) + k as f64 * gap;
        }
    }
    // Into [lo, hi]: push the top ones down, then pull the bottom ones up.
    let mut previous = f64::NEG_INFINITY;
    for &i in &order {
        placed[i] = placed[i].max(lo).max(previous + gap);
        previous = placed[i];
    }
    let mut next = f64::INFINITY;
    for &i in order.iter().rev() {
        placed[i] = placed[i].min(hi).min(next - gap);
        next = placed[i];
    }
    placed
}

/// Vertical centres for labels that start at `x` and are `width` wide,
/// wanting to be centred at `y`, one `row` tall: labels whose horizontal
/// extents overlap (directly or through others) are [`spread`] apart as
/// one column; labels side by side keep their place.
pub fn place_labels(labels: &[(f64, f64, f64)], row: f64, lo: f64, hi: f64) -> Vec<f64> {
    let mut by_x: Vec<usize> = (0..labels.len()).collect();
    by_x.sort_by(|&a, &b| labels[a].0.total_cmp(&labels[b].0).then(a.cmp(&b)));
    let mut placed: Vec<f64> = labels.iter().map(|l| l.1).collect();
    let mut column: Vec<usize> = Vec::new();
    let mut right = f64::NEG_INFINITY;
    let settle = |column: &mut Vec<usize>, placed: &mut Vec<f64>| {
        let wanted: Vec<f64> = column.iter().map(|&i| labels[i].1).collect();
        for (&i, y) in column.iter().zip(spread(&wanted, row, lo, hi)) {
            placed[i] = y;
        }
        column.clear();
    };
    for &i in &by_x {
        let (x, _, width) = labels[i];
        if x > right && !column.is_empty() {
            settle(&mut column, &mut placed);
        }
        column.push(i);
        right = right.max(x + width);
    }
    settle(&mut column, &mut placed);
    placed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_far_apart_stay_where_they_are() {
        assert_eq!(
            spread(&[10.0, 50.0, 90.0], 16.0, 0.0, 100.0),
            [10.0, 50.0, 90.0]
        );
    }

    #[test]
    fn labels_on_the_same_spot_are_split_evenly_around_it() {
        // Three lines ending on the same value (counter and queue on
        // B-extreme): one label each, 16 apart, centred where they all
        // wanted to be, in the order given.
        assert_eq!(
            spread(&[50.0, 50.0, 50.0], 16.0, 0.0, 100.0),
            [34.0, 50.0, 66.0]
        );
    }

    #[test]
    fn crowded_labels_never_overlap_and_keep_their_order() {
        let wanted = [99.0, 3.0, 98.5, 97.0, 0.0, 98.0, 99.5, 1.0, 2.0];
        let placed = spread(&wanted, 16.0, 0.0, 300.0);
        let mut order: Vec<usize> = (0..wanted.len()).collect();
        order.sort_by(|&a, &b| wanted[a].total_cmp(&wanted[b]).then(a.cmp(&b)));
        for pair in order.windows(2) {
            let gap = placed[pair[1]] - placed[pair[0]];
            assert!(gap >= 16.0 - 1e-9, "{placed:?}");
        }
        assert!(
            placed.iter().all(|y| (0.0..=300.0).contains(y)),
            "{placed:?}"
        );
    }

    #[test]
    fn labels_stay_inside_the_bounds_even_when_the_gap_must_shrink() {
        let placed = spread(&[0.0; 5], 16.0, 10.0, 50.0);
        assert_eq!(placed, [10.0, 20.0, 30.0, 40.0, 50.0]);
        let placed = spread(&[500.0, 500.0], 16.0, 0.0, 100.0);
        assert_eq!(placed, [84.0, 100.0]);
    }

    #[test]
    fn only_labels_that_overlap_sideways_share_a_column() {
        // Two at the same height but far apart sideways keep it; a third
        // over the second's extent is moved apart from it.
        let labels = [(0.0, 50.0, 30.0), (100.0, 50.0, 30.0), (120.0, 52.0, 30.0)];
        let placed = place_labels(&labels, 16.0, 0.0, 200.0);
        assert_eq!(placed[0], 50.0);
        assert!((placed[2] - placed[1] - 16.0).abs() < 1e-9, "{placed:?}");
    }

    #[test]
    fn values_of_one_chart_share_their_decimals() {
        assert_eq!(value_labels(&[6133.0, 5660.0]), ["6133", "5660"]);
        assert_eq!(value_labels(&[4927.66, 270.1]), ["4928", "270"]);
        assert_eq!(value_labels(&[20.84, 7.9]), ["20.8", "7.9"]);
        assert_eq!(value_labels(&[3.63, 3.1, 0.6]), ["3.63", "3.10", "0.60"]);
        assert_eq!(value_labels(&[-3.0, 0.0]), ["-3", "0"]);
        assert!(value_labels(&[]).is_empty());
    }
}
