//! A small line diff for what an operator reads before approving a file change: Myers'
//! O((N+M)·D) shortest edit script over lines (common prefix and suffix trimmed first), printed
//! as a unified diff with three lines of context. Bounded: past `max_edits` the changed middle is
//! shown as one replacement, and the printed text stops at `max_bytes`.

/// One step of an edit script over lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// The line is in both (old index, new index).
    Keep(usize, usize),
    /// The old line is removed.
    Delete(usize),
    /// The new line is added.
    Insert(usize),
}

/// Splits text into lines, each keeping its `\n` (the last may lack one).
pub fn lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// A shortest edit script turning `a` into `b` when it needs at most `max_edits` insertions
/// and deletions (after trimming the common prefix and suffix); otherwise a correct but longer
/// one that replaces the whole changed middle.
pub fn edits(a: &[&str], b: &[&str], max_edits: usize) -> Vec<Edit> {
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let mut out: Vec<Edit> = (0..pre).map(|i| Edit::Keep(i, i)).collect();
    match myers(am, bm, max_edits) {
        Some(mid) => out.extend(mid.into_iter().map(|e| match e {
            Edit::Keep(i, j) => Edit::Keep(i + pre, j + pre),
            Edit::Delete(i) => Edit::Delete(i + pre),
            Edit::Insert(j) => Edit::Insert(j + pre),
        })),
        None => {
            out.extend((0..am.len()).map(|i| Edit::Delete(i + pre)));
            out.extend((0..bm.len()).map(|j| Edit::Insert(j + pre)));
        }
    }
    let (ao, bo) = (a.len() - suf, b.len() - suf);
    out.extend((0..suf).map(|i| Edit::Keep(ao + i, bo + i)));
    out
}

fn myers(a: &[&str], b: &[&str], max_d: usize) -> Option<Vec<Edit>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m) as usize;
    let off = max as isize + 1;
    let mut v = vec![0isize; 2 * max + 3];
    // trace[d] = v over k in -d..=d after step d.
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'outer: for d in 0..=max.min(max_d) as isize {
        for k in (-d..=d).step_by(2) {
            let at = |k: isize| (k + off) as usize;
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                v[at(k + 1)]
            } else {
                v[at(k - 1)] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                trace.push(v[(off - d) as usize..=(off + d) as usize].to_vec());
                found = Some(d);
                break 'outer;
            }
        }
        trace.push(v[(off - d) as usize..=(off + d) as usize].to_vec());
    }
    let total = found?;
    let mut out = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (1..=total).rev() {
        let prev = &trace[(d - 1) as usize];
        let get = |k: isize| prev[(k + d - 1) as usize];
        let k = x - y;
        let pk = if k == -d || (k != d && get(k - 1) < get(k + 1)) {
            k + 1
        } else {
            k - 1
        };
        let px = get(pk);
        let py = px - pk;
        while x > px && y > py {
            x -= 1;
            y -= 1;
            out.push(Edit::Keep(x as usize, y as usize));
        }
        if x == px {
            y -= 1;
            out.push(Edit::Insert(y as usize));
        } else {
            x -= 1;
            out.push(Edit::Delete(x as usize));
        }
    }
    while x > 0 && y > 0 {
        x -= 1;
        y -= 1;
        out.push(Edit::Keep(x as usize, y as usize));
    }
    out.reverse();
    Some(out)
}

/// A unified diff and its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unified {
    pub text: String,
    pub added: usize,
    pub removed: usize,
    /// The text stopped at the byte bound; the counts are still whole.
    pub truncated: bool,
}

const CONTEXT: usize = 3;

/// A unified diff (`--- old_name`, `+++ new_name`, hunks with three lines of context);
/// empty text when nothing changed.
pub fn unified(
    old: &str,
    new: &str,
    old_name: &str,
    new_name: &str,
    max_edits: usize,
    max_bytes: usize,
) -> Unified {
    let (a, b) = (lines(old), lines(new));
    let script = edits(&a, &b, max_edits);
    let added = script
        .iter()
        .filter(|e| matches!(e, Edit::Insert(_)))
        .count();
    let removed = script
        .iter()
        .filter(|e| matches!(e, Edit::Delete(_)))
        .count();
    let mut text = String::new();
    let mut truncated = false;
    if added + removed > 0 {
        text.push_str(&format!("--- {old_name}\n+++ {new_name}\n"));
    }
    // Group changes into hunks: a hunk spans changes separated by at most 2*CONTEXT kept lines.
    let changed: Vec<usize> = script
        .iter()
        .enumerate()
        .filter(|(_, e)| !matches!(e, Edit::Keep(..)))
        .map(|(i, _)| i)
        .collect();
    let mut i = 0;
    while i < changed.len() {
        let mut j = i;
        while j + 1 < changed.len() && changed[j + 1] - changed[j] <= 2 * CONTEXT + 1 {
            j += 1;
        }
        let start = changed[i].saturating_sub(CONTEXT);
        let end = (changed[j] + CONTEXT + 1).min(script.len());
        let hunk = &script[start..end];
        // Line numbers: the first old/new line a hunk touches (1-based; 0 when a side is empty).
        let (mut old_at, mut new_at) = position(&script, start);
        let (old_len, new_len) = hunk.iter().fold((0, 0), |(o, n), e| match e {
            Edit::Keep(..) => (o + 1, n + 1),
            Edit::Delete(_) => (o + 1, n),
            Edit::Insert(_) => (o, n + 1),
        });
        if old_len > 0 {
            old_at += 1;
        }
        if new_len > 0 {
            new_at += 1;
        }
        let mut h = format!("@@ -{old_at},{old_len} +{new_at},{new_len} @@\n");
        for e in hunk {
            let (sign, line) = match *e {
                Edit::Keep(x, _) => (' ', a[x]),
                Edit::Delete(x) => ('-', a[x]),
                Edit::Insert(y) => ('+', b[y]),
            };
            h.push(sign);
            h.push_str(line);
            if !line.ends_with('\n') {
                h.push_str("\n\\ No newline at end of file\n");
            }
        }
        if text.len() + h.len() > max_bytes {
            truncated = true;
            break;
        }
        text.push_str(&h);
        i = j + 1;
    }
    Unified {
        text,
        added,
        removed,
        truncated,
    }
}

/// Old and new lines consumed before script step `upto`.
fn position(script: &[Edit], upto: usize) -> (usize, usize) {
    script[..upto].iter().fold((0, 0), |(o, n), e| match e {
        Edit::Keep(..) => (o + 1, n + 1),
        Edit::Delete(_) => (o + 1, n),
        Edit::Insert(_) => (o, n + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn apply(a: &[&str], b: &[&str], script: &[Edit]) -> (Vec<String>, Vec<String>) {
        let mut old = Vec::new();
        let mut new = Vec::new();
        for e in script {
            match *e {
                Edit::Keep(x, y) => {
                    assert_eq!(a[x], b[y], "a kept line is equal on both sides");
                    old.push(a[x].to_string());
                    new.push(b[y].to_string());
                }
                Edit::Delete(x) => old.push(a[x].to_string()),
                Edit::Insert(y) => new.push(b[y].to_string()),
            }
        }
        (old, new)
    }

    fn lcs(a: &[&str], b: &[&str]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                t[i][j] = if a[i] == b[j] {
                    t[i + 1][j + 1] + 1
                } else {
                    t[i + 1][j].max(t[i][j + 1])
                };
            }
        }
        t[0][0]
    }

    proptest! {
        #[test]
        fn the_script_rebuilds_both_sides_and_is_shortest(
            a in proptest::collection::vec(0u8..4, 0..30),
            b in proptest::collection::vec(0u8..4, 0..30),
        ) {
            let names = ["w\n", "x\n", "y\n", "z"];
            let a: Vec<&str> = a.iter().map(|i| names[*i as usize]).collect();
            let b: Vec<&str> = b.iter().map(|i| names[*i as usize]).collect();
            let script = edits(&a, &b, usize::MAX);
            let (old, new) = apply(&a, &b, &script);
            prop_assert_eq!(old, a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            prop_assert_eq!(new, b.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            let kept = script.iter().filter(|e| matches!(e, Edit::Keep(..))).count();
            prop_assert_eq!(kept, lcs(&a, &b));
            // Bounded: still correct, just longer.
            let short = edits(&a, &b, 1);
            let (old, new) = apply(&a, &b, &short);
            prop_assert_eq!(old.concat(), a.concat());
            prop_assert_eq!(new.concat(), b.concat());
        }
    }

    #[test]
    fn unified_output_matches_the_usual_format() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nk";
        let u = unified(old, new, "a/f.txt", "b/f.txt", 1000, 1 << 16);
        assert_eq!(
            u.text,
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,5 +1,5 @@\n a\n-b\n+B\n c\n d\n e\n\
             @@ -8,3 +8,4 @@\n h\n i\n j\n+k\n\\ No newline at end of file\n"
        );
        assert_eq!((u.added, u.removed, u.truncated), (2, 1, false));
        let created = unified("", "x\n", "/dev/null", "b/f", 1000, 1 << 16);
        assert_eq!(
            created.text,
            "--- /dev/null\n+++ b/f\n@@ -0,0 +1,1 @@\n+x\n"
        );
        assert_eq!(unified("same\n", "same\n", "a", "b", 10, 100).text, "");
        let cut = unified(old, new, "a/f.txt", "b/f.txt", 1000, 60);
        assert!(cut.truncated && cut.text.len() <= 60 && cut.added == 2);
    }
}
