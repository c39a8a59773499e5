//! What an acquisition locks: one resource name or several, as one
//! argument type.

/// What a lock call locks: one resource name, or a set of names that is
/// locked as a whole.
///
/// Every acquisition method of [`Redlock`](crate::Redlock) takes it, so one
/// name and a set go through the same calls:
///
/// | what you pass | locks |
/// |---|---|
/// | `"job"`, a `String` or a `&String` | one resource |
/// | `["a", "b"]`, `&["a", "b"]`, a slice, a `Vec` of `&str` or `String` (owned or borrowed) | every name, all or nothing |
///
/// The rule: one `str` or `String` (behind any number of `&`), or an
/// array, slice or `Vec` whose items are `AsRef<str>` (`&str`, `String`,
/// `&String`, `Box<str>`, `Arc<str>`, `Cow<str>`, …). Collect an iterator
/// or a set into a `Vec` first: `lock(names.iter().collect::<Vec<_>>(),
/// ttl)`. An empty literal needs its type spelled out (`&[] as &[&str]`);
/// it is refused with [`Error::NoResources`](crate::Error::NoResources).
///
/// A set of one name is the same lock as that name alone. The names are
/// checked before anything is sent: none is empty, none is given twice, and
/// there are at most [`MAX_RESOURCES`](crate::MAX_RESOURCES).
///
/// The trait is sealed: the implementations above are all there are.
pub trait Resources: sealed::Sealed {}

impl<T: sealed::Sealed + ?Sized> Resources for T {}

mod sealed {
    /// The names of a [`Resources`](super::Resources) argument, borrowed
    /// where they can be (one name never allocates).
    #[derive(Debug)]
    pub enum Names<'a> {
        /// One name.
        One(&'a str),
        /// Several names, collected.
        Many(Vec<&'a str>),
    }

    impl<'a> Names<'a> {
        /// The names as a slice, in the order given.
        pub fn as_slice(&self) -> &[&'a str] {
            match self {
                Names::One(name) => std::slice::from_ref(name),
                Names::Many(names) => names,
            }
        }
    }

    /// The one method behind [`Resources`](super::Resources), out of the
    /// public API.
    pub trait Sealed {
        /// The names to lock.
        fn names(&self) -> Names<'_>;
    }

    impl Sealed for str {
        fn names(&self) -> Names<'_> {
            Names::One(self)
        }
    }

    impl Sealed for String {
        fn names(&self) -> Names<'_> {
            Names::One(self)
        }
    }

    impl<S: AsRef<str>> Sealed for [S] {
        fn names(&self) -> Names<'_> {
            Names::Many(self.iter().map(AsRef::as_ref).collect())
        }
    }

    impl<S: AsRef<str>, const N: usize> Sealed for [S; N] {
        fn names(&self) -> Names<'_> {
            self.as_slice().names()
        }
    }

    impl<S: AsRef<str>> Sealed for Vec<S> {
        fn names(&self) -> Names<'_> {
            self.as_slice().names()
        }
    }

    impl<T: Sealed + ?Sized> Sealed for &T {
        fn names(&self) -> Names<'_> {
            (**self).names()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::{Names, Sealed};
    use super::*;

    fn names_of(resources: impl Resources) -> Vec<String> {
        resources
            .names()
            .as_slice()
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    #[test]
    fn every_form_gives_its_names_in_order() {
        let owned = String::from("job");
        assert_eq!(names_of("job"), ["job"]);
        assert_eq!(names_of(&owned), ["job"]);
        assert_eq!(names_of(owned.clone()), ["job"]);
        assert_eq!(names_of(["a", "b"]), ["a", "b"]);
        #[allow(clippy::needless_borrows_for_generic_args)]
        let borrowed = names_of(&["a", "b"]);
        assert_eq!(borrowed, ["a", "b"]);
        assert_eq!(names_of(&["a", "b"][..]), ["a", "b"]);
        assert_eq!(names_of(vec!["b", "a"]), ["b", "a"]);
        let strings = vec![String::from("x"), String::from("y")];
        assert_eq!(names_of(&strings), ["x", "y"]);
        assert_eq!(names_of(&strings[..]), ["x", "y"]);
        assert_eq!(names_of(strings), ["x", "y"]);
        let shared: Vec<std::sync::Arc<str>> = vec!["p".into(), "q".into()];
        assert_eq!(names_of(&shared), ["p", "q"]);
        let cows = [
            std::borrow::Cow::Borrowed("c"),
            std::borrow::Cow::Owned("d".into()),
        ];
        assert_eq!(names_of(cows), ["c", "d"]);
        let boxed: Vec<Box<str>> = vec!["b".into()];
        assert_eq!(names_of(boxed), ["b"]);
        let none: [&str; 0] = [];
        assert!(names_of(none).is_empty());
    }

    #[test]
    fn one_name_is_borrowed() {
        assert!(matches!("job".names(), Names::One("job")));
        assert!(matches!(String::from("job").names(), Names::One("job")));
    }
}
