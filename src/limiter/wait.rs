//! [`Limiter::until_ready`]: waiting until a request fits.
