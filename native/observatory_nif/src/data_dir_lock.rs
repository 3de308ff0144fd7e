//! NIFs behind `Observatory.DataDirLock` and `Observatory.DataDir`: an exclusive OS
//! lock on a file (`flock` on Unix), held while the resource lives and released by
//! the kernel when the OS process ends, however it ends; and the process's umask.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;

use parking_lot::Mutex;
use rustler::{Binary, Encoder, Env, ResourceArc, Term};

use crate::atoms;

/// The open, locked lock file; `None` once released.
pub struct DirLock(Mutex<Option<File>>);

#[rustler::resource_impl]
impl rustler::Resource for DirLock {}

/// `{:ok, lock}`, `{:error, :locked}` when another open file holds it (this OS
/// process or another), or `{:error, message}` when the file cannot be opened.
/// On success the file holds this OS process's id, for the error message of the next
/// one that tries.
#[rustler::nif(schedule = "DirtyIo")]
fn data_dir_lock<'a>(env: Env<'a>, path: Binary<'a>) -> Term<'a> {
    let path = OsStr::from_bytes(path.as_slice());
    let file = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) => return (atoms::error(), e.to_string()).encode(env),
    };
    match file.try_lock() {
        Ok(()) => {
            // Best effort: the lock is what matters, the pid is for the message.
            let _ = file.set_len(0);
            let _ = writeln!(&file, "{}", std::process::id());
            let lock = ResourceArc::new(DirLock(Mutex::new(Some(file))));
            (atoms::ok(), lock).encode(env)
        }
        Err(TryLockError::WouldBlock) => (atoms::error(), atoms::locked()).encode(env),
        Err(TryLockError::Error(e)) => (atoms::error(), e.to_string()).encode(env),
    }
}

/// Releases the lock now (closing the file); false when it was released already.
#[rustler::nif]
fn data_dir_unlock(lock: ResourceArc<DirLock>) -> bool {
    lock.0.lock().take().is_some()
}

/// Sets the OS process's file mode creation mask so that every file and directory it
/// creates from now on is its owner's alone (`umask 077`, as PostgreSQL does); returns
/// the previous mask.
#[rustler::nif]
fn umask_owner_only() -> u32 {
    // SAFETY: umask(2) cannot fail and touches no memory.
    unsafe { libc::umask(0o077) }
}
