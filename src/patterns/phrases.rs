//! Substring phrase matching for the whole policy in one pass.
//!
//! A selection asks ~90 "does the request text contain X?" questions (keywords and signal
//! phrases). Instead of 90 searches, every phrase of the policy gets an id in a
//! [`PhraseIndex`], the text is scanned once (candidates bucketed by first byte), and each
//! question becomes a bit lookup in the resulting [`PhraseHits`]. Matching stays a plain
//! substring test, exactly as in the reference.

use serde::Deserialize;

/// A list of phrases from the policy; ids are assigned when the policy is compiled.
#[derive(Clone, Deserialize)]
#[serde(from = "Vec<String>")]
pub struct Phrases {
    pub words: Vec<String>,
    ids: Vec<u32>,
}

impl From<Vec<String>> for Phrases {
    fn from(words: Vec<String>) -> Self {
        Self {
            words,
            ids: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Phrases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.words.fmt(f)
    }
}

impl Phrases {
    /// True when the scanned text contained any of these phrases.
    pub fn any(&self, hits: &PhraseHits) -> bool {
        self.ids.iter().any(|&id| hits.get(id))
    }

    /// The phrases the scanned text contained, in list order.
    pub fn found<'a>(&'a self, hits: &'a PhraseHits) -> impl Iterator<Item = &'a String> + 'a {
        self.words
            .iter()
            .zip(&self.ids)
            .filter(|(_, id)| hits.get(**id))
            .map(|(w, _)| w)
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// Stands for the second byte of a phrase that has none.
const ONE_BYTE: u16 = 256;

/// Every distinct phrase of a policy, bucketed by first byte.
#[derive(Debug, Clone, Default)]
pub struct PhraseIndex {
    phrases: Vec<Box<[u8]>>,
    /// Per first byte, its phrases: (second byte, or [`ONE_BYTE`] for a one-byte phrase; id).
    by_first: Vec<Vec<(u16, u32)>>,
    /// Per first byte, the second bytes its phrases go on with (all of them when a phrase is
    /// that one byte): most text positions are ruled out without comparing any phrase.
    second: Vec<[u64; 4]>,
}

impl PhraseIndex {
    /// Index `lists`, giving each of their phrases an id (identical phrases share one).
    pub fn build<'a>(lists: impl IntoIterator<Item = &'a mut Phrases>) -> PhraseIndex {
        let mut index = PhraseIndex {
            phrases: Vec::new(),
            by_first: vec![Vec::new(); 256],
            second: vec![[0; 4]; 256],
        };
        for list in lists {
            list.ids = list
                .words
                .iter()
                .map(|w| index.intern(w.as_bytes()))
                .collect();
        }
        index
    }

    fn intern(&mut self, phrase: &[u8]) -> u32 {
        if let Some(id) = self.phrases.iter().position(|p| &**p == phrase) {
            return id as u32;
        }
        let id = self.phrases.len() as u32;
        self.phrases.push(phrase.into());
        // Blank phrases are rejected by policy validation; an empty one would match anything.
        let bucket = phrase.first().copied().unwrap_or(0);
        let second = phrase.get(1).map_or(ONE_BYTE, |&b| u16::from(b));
        self.by_first[usize::from(bucket)].push((second, id));
        let set = &mut self.second[usize::from(bucket)];
        match phrase.get(1) {
            Some(&next) => set[usize::from(next >> 6)] |= 1 << (next & 63),
            None => *set = [u64::MAX; 4],
        }
        id
    }

    /// Which phrases occur in `text`.
    pub fn scan(&self, text: &str) -> PhraseHits {
        let mut hits = PhraseHits(vec![0u64; self.phrases.len().div_ceil(64)]);
        let bytes = text.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            let bucket = &self.by_first[usize::from(b)];
            if bucket.is_empty() {
                continue;
            }
            let next = bytes.get(i + 1).map_or(ONE_BYTE, |&n| u16::from(n));
            if let Some(&n) = bytes.get(i + 1) {
                let set = &self.second[usize::from(b)];
                if set[usize::from(n >> 6)] & (1 << (n & 63)) == 0 {
                    continue;
                }
            }
            // A phrase whose second byte differs is passed over without comparing it.
            for &(second, id) in bucket {
                if second != ONE_BYTE && second != next {
                    continue;
                }
                if !hits.get(id) && bytes[i..].starts_with(&self.phrases[id as usize]) {
                    hits.0[id as usize / 64] |= 1 << (id % 64);
                }
            }
        }
        hits
    }
}

/// The result of [`PhraseIndex::scan`]: one bit per phrase id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhraseHits(Vec<u64>);

impl PhraseHits {
    pub fn get(&self, id: u32) -> bool {
        self.0
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(words: &[&str]) -> Phrases {
        Phrases::from(words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn shared_phrases_share_an_id_and_match_as_substrings() {
        let mut a = list(&["test", "same file"]);
        let mut b = list(&["test", "x"]);
        let index = PhraseIndex::build([&mut a, &mut b]);
        assert_eq!(index.phrases.len(), 3);
        let hits = index.scan("the latest edit");
        assert!(a.any(&hits) && b.any(&hits));
        assert_eq!(a.found(&hits).collect::<Vec<_>>(), vec!["test"]);
        let hits = index.scan("");
        assert!(!a.any(&hits));
    }

    proptest! {
        #[test]
        fn scan_agrees_with_str_contains(text in "[a-e ]{0,300}", words in prop::collection::vec("[a-e ]{1,4}", 1..20)) {
            let mut p = Phrases::from(words.clone());
            let index = PhraseIndex::build([&mut p]);
            let hits = index.scan(&text);
            let expected: Vec<&String> = words.iter().filter(|w| text.contains(w.as_str())).collect();
            prop_assert_eq!(p.found(&hits).collect::<Vec<_>>(), expected);
        }
    }
}
