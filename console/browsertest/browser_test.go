package browsertest

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// screenshots, when set, writes a screenshot (PNG) of each page to
// docs/console.
var screenshots = flag.Bool("screenshots", false, "write docs/console/*.png")

func TestMain(m *testing.M) { os.Exit(dbtest.Main(m).Run()) }

// chromium returns the browser binary, skipping the test without one
// (failing under CI=true, where .ci/run installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: .ci/run installs Debian's chromium")
	}
	t.Skip("no chromium on PATH")
	return ""
}

// TestRequeueInTheBrowser: open the queues page, go to the dead letters,
// list them, requeue one through its confirmation, and see it leave the
// list.
func TestRequeueInTheBrowser(t *testing.T) {
	bin := chromium(t)
	url := dbtest.DatabaseURL(t)
	cfg := leasing.PostgresOptions{}
	inbox := dbtest.OpenStore(t, url, leasing.Inbox, cfg)
	outbox := dbtest.OpenStore(t, url, leasing.Outbox, cfg)
	ctx := t.Context()
	res, err := inbox.Enqueue(ctx,
		leasing.NewMessage{Type: "order.created", Payload: []byte(`{"order":1042,"total":"19.90","items":[{"sku":"A-7","qty":2}]}`)},
		leasing.NewMessage{Type: "order.created", Payload: []byte(`{"order":1043}`)},
		leasing.NewMessage{Type: "invoice.sent", Payload: []byte(`<script>alert(1)</script>`)},
		leasing.NewMessage{Type: "order.created", Payload: []byte(`{"order":1044}`)})
	require.NoError(t, err)
	for i, reason := range []string{"payment gateway: 502 Bad Gateway", "payment gateway: 502 Bad Gateway", "invoice template missing"} {
		_, err := inbox.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: res.IDs[i], Reason: reason})
		require.NoError(t, err)
	}
	_, err = outbox.Enqueue(ctx, leasing.NewMessage{Type: "order.shipped", Topic: "orders"})
	require.NoError(t, err)

	c, err := console.New(console.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, inbox, outbox)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	defer srv.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.WindowSize(1280, 800))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()

	// The first Run starts the browser: no timeout on its context.
	_, err = chromedp.Run(bctx, chromedp.Navigate(srv.URL+"/"))
	require.NoError(t, err)
	if *screenshots {
		require.NoError(t, os.MkdirAll(filepath.Join("..", "..", "docs", "console"), 0o755))
	}
	step := func(name string, actions ...chromedp.Action[chromedp.Void]) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		require.NoError(t, chromedp.Do(sctx, actions...), name)
		text, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS("main")))
		require.NoError(t, err, name)
		if *screenshots && name != "after" {
			png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
			require.NoError(t, err, name)
			require.NoError(t, os.WriteFile(filepath.Join("..", "..", "docs", "console", name+".png"), png, 0o644))
		}
		return text
	}

	dead := res.IDs[0].String()
	queues := step("queues", chromedp.WaitVisible(chromedp.CSS("main table")))
	groups := step("dead-letters",
		chromedp.Click(chromedp.CSS(`nav a[href$="dead-letters"]`)),
		chromedp.WaitVisible(chromedp.CSS("main table")))
	// Filter the message list to the dead letters with the form.
	list := step("messages",
		chromedp.Navigate(srv.URL+"/messages?queue=inbox"),
		chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "dead_lettered"),
		chromedp.SetValue(chromedp.CSS(`input[name="error"]`), "gateway"),
		chromedp.Submit(chromedp.CSS(`form.filter`)),
		chromedp.WaitVisible(chromedp.CSS(`#messages a[href$="`+res.IDs[1].String()+`"]`)))
	detail := step("message",
		chromedp.Click(chromedp.CSS(`#messages a[href$="`+dead+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#payload")))
	step("confirm",
		chromedp.Click(chromedp.CSS(`a[href*="action=requeue"]`)),
		chromedp.WaitVisible(chromedp.CSS("#confirm")))
	step("done",
		chromedp.Click(chromedp.CSS("#confirm")),
		chromedp.WaitVisible(chromedp.CSS("#done")))
	after := step("after",
		chromedp.Navigate(srv.URL+"/messages?queue=inbox&status=dead_lettered&error=gateway"),
		chromedp.WaitVisible(chromedp.CSS("#messages")))
	require.Contains(t, queues, "inbox")
	require.Contains(t, groups, "payment gateway: 502 Bad Gateway")
	require.Contains(t, list, dead)
	require.Contains(t, list, res.IDs[1].String())
	require.NotContains(t, list, res.IDs[2].String())
	require.Contains(t, detail, `"order": 1042`)
	require.NotContains(t, after, dead, "the requeued message left the list")
	require.Contains(t, after, res.IDs[1].String())
	row, err := inbox.Get(ctx, res.IDs[0])
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)
	require.True(t, strings.Contains(groups, "invoice template missing"))
}
