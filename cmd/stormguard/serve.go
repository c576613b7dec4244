package main

import (
	"embed"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"time"
)

// web holds the live page: its HTML, its script (which draws plain SVG)
// and its style sheet. Nothing is loaded from the network.
//
//go:embed web
var web embed.FS

// pageHandler serves the live page of b: the page at /, its assets, and
// the board as JSON at /data.json.
func pageHandler(b *board) http.Handler {
	assets, err := fs.Sub(web, "web")
	if err != nil { // the embedded folder is there: a build error otherwise
		panic(err)
	}
	mux := http.NewServeMux()
	files := http.FileServerFS(assets)
	mux.Handle("GET /", noCache(files))
	mux.HandleFunc("GET /data.json", func(w http.ResponseWriter, r *http.Request) {
		data, err := json.Marshal(b.snapshot())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(data)
	})
	return mux
}

// noCache makes the browser ask again for every asset: a page left open
// across two versions of the binary gets the new one.
func noCache(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// servePage serves the live page of b on ln until the returned stop is
// called.
func servePage(ln net.Listener, b *board) (stop func()) {
	srv := &http.Server{Handler: pageHandler(b), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		_ = srv.Close()
		<-done
	}
}
