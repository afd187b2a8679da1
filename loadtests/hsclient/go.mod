module geoedge/loadtests/hsclient

go 1.19
