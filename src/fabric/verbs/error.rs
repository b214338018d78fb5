//! Errors of verbs calls: every one names the verb and carries the errno.

use std::io;

/// The error of `verb` failing with `errno`, e.g.
/// `ibv_reg_mr: Cannot allocate memory (os error 12)`. The kind is the errno's kind.
pub(crate) fn verb_error(verb: &str, errno: i32) -> io::Error {
    let os = io::Error::from_raw_os_error(errno);
    io::Error::new(os.kind(), format!("{verb}: {os}"))
}

/// The error of a verb that reported failure through `errno` (a null pointer or -1).
pub(crate) fn last_verb_error(verb: &str) -> io::Error {
    let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // A verb that failed without setting errno still failed: call it EIO.
    verb_error(verb, if errno == 0 { libc::EIO } else { errno })
}

/// Checks the return value of an `int`-returning verb. rdma-core verbs return 0 on
/// success and either a positive errno or -1 with `errno` set on failure (a few
/// providers return a negative errno); all three are handled.
pub(crate) fn check(verb: &str, ret: i32) -> io::Result<()> {
    match ret {
        0 => Ok(()),
        -1 => Err(last_verb_error(verb)),
        r if r < 0 => Err(verb_error(verb, -r)),
        r => Err(verb_error(verb, r)),
    }
}

/// The errno of a failed `int`-returning verb, as [`check`] interprets it.
pub(crate) fn errno_of(ret: i32) -> i32 {
    match ret {
        -1 => io::Error::last_os_error()
            .raw_os_error()
            .filter(|&e| e != 0)
            .unwrap_or(libc::EIO),
        r if r < 0 => -r,
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_the_verb_and_errno() {
        let e = verb_error("ibv_reg_mr", libc::ENOMEM);
        assert_eq!(
            e.to_string(),
            "ibv_reg_mr: Cannot allocate memory (os error 12)"
        );
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        assert!(check("ibv_modify_qp", 0).is_ok());
        let e = check("ibv_modify_qp", libc::EINVAL).unwrap_err();
        assert!(e.to_string().starts_with("ibv_modify_qp: Invalid argument"));
        assert_eq!(errno_of(-libc::EAGAIN), libc::EAGAIN);
        assert_eq!(errno_of(libc::ENOMEM), libc::ENOMEM);
    }
}
