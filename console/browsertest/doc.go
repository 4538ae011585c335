// Package browsertest drives the web console (package console) in a real
// browser: Chromium, headless, through chromedp. It is a module of its
// own so that the library's module graph does not carry chromedp. The
// tests skip without a Chromium binary unless CI is set (.ci/run installs
// Debian's chromium).
package browsertest
