//! The files this process is reading: every live [`SafeTensors`] and every
//! live [`Checkpoint`]'s index register their identity here, so that a
//! [`SafeTensorsWriter`] of the same process can refuse to write over any
//! of them, whoever opened them.
//!
//! [`SafeTensors`]: super::SafeTensors
//! [`Checkpoint`]: super::Checkpoint
//! [`SafeTensorsWriter`]: super::SafeTensorsWriter

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use super::open::FileId;

/// identity -> (a path it was opened by, number of live registrations)
static READING: LazyLock<Mutex<HashMap<FileId, (PathBuf, usize)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A registration, removed when dropped.
#[derive(Debug)]
pub(crate) struct Reading {
    id: FileId,
}

impl Reading {
    /// Registers `id` (opened as `path`) as being read.
    pub fn register(id: FileId, path: &Path) -> Reading {
        let mut map = READING.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id).or_insert_with(|| (path.to_owned(), 0)).1 += 1;
        Reading { id }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut map = READING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get_mut(&self.id) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                map.remove(&self.id);
            }
        }
    }
}

/// The path of a live reader of `id`, if this process is reading it.
pub(crate) fn reader_of(id: FileId) -> Option<PathBuf> {
    let map = READING.lock().unwrap_or_else(|p| p.into_inner());
    map.get(&id).map(|(p, _)| p.clone())
}
